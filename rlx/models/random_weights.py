"""Local HF model directories of a real model's dimensions with seeded random weights, for GPU tests and benchmarks
(nothing to download): the weights are bf16 N(0, 0.02) (norms 1, biases 0, seed 0), the tokenizer is rlx's byte
tokenizer (any text encodes; ids past its 259 tokens decode to nothing), the embedding keeps the model's vocabulary.
Written once, atomically, and reused.

    python -m rlx.models.random_weights qwen2.5-0.5b [DIR]     # prints the directory
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile

SHAPES: dict[str, dict] = {
    # Qwen2.5-0.5B's config.json, minus what does not shape the computation
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6),
    # Qwen2.5-1.5B's config.json, likewise
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6),
    # Qwen2.5-1.5B's dims with an untied head whose EOS row ends responses at widely spread lengths, about 10% of them
    # running to 4096 tokens (the long tail of real rollouts; set_stop_rate)
    "qwen2.5-1.5b-longtail": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                  num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                  tie_word_embeddings=False, max_position_embeddings=32768, rope_theta=1e6,
                                  rms_norm_eps=1e-6, stop_at=(4096, 0.1)),
    # the same at Qwen2.5-0.5B's dims, about half of the responses running to 200 tokens
    "qwen2.5-0.5b-longtail": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                  tie_word_embeddings=False, max_position_embeddings=32768, rope_theta=1e6,
                                  rms_norm_eps=1e-6, stop_at=(200, 0.5)),
}
WEIGHTS = "bf16 N(0, 0.02), norms 1, biases 0, seed 0; byte tokenizer; rotary buffers computed"


def random_model_dir(shape: str, path: str | None = None) -> str:
    """The directory of `shape` (a key of SHAPES) with random weights: `path`, or one under rlx's cache dir."""
    from rlx.models import cache_dir

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
    spec = json.dumps(dict(SHAPES[shape], weights=WEIGHTS), sort_keys=True)
    path = path or str(cache_dir() / "models" / f"random-{shape}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}")
    if os.path.exists(os.path.join(path, ".complete")):
        return path
    import transformers

    from rlx.models import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    dims = dict(SHAPES[shape])
    stop_at = dims.pop("stop_at", None)
    cfg = transformers.AutoConfig.for_model(dims.pop("model_type"), **dims, initializer_range=0.02,
                                            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                                            eos_token_id=tokenizer.eos_token_id, dtype="bfloat16")
    model = random_model(cfg)
    if stop_at:
        set_stop_rate(model, tokenizer.eos_token_id, *stop_at)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".rlx-random-")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    open(os.path.join(tmp, ".complete"), "w").close()
    if os.path.exists(path):  # an incomplete leftover
        import shutil
        shutil.rmtree(path)
    os.rename(tmp, path)
    return path



def random_model(cfg):
    """The HF causal LM of `cfg` in bf16 with seeded random weights (normal(0, 0.02), norms 1, biases 0), built on
    the meta device and drawn once per parameter (no init pass): what the random-weight model directories hold."""
    import torch
    import transformers

    from rlx.models.hf_compat import dtype_kwargs

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, **dtype_kwargs(torch.bfloat16))
    model.to_empty(device="cpu")
    _compute_buffers(model)
    if cfg.tie_word_embeddings:  # to_empty gave the tied head its own storage
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # shared (tied) parameters come once
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model


def _compute_buffers(model) -> None:
    """`to_empty` leaves the buffers uninitialised: each module holding some (the rotary embedding's inverse
    frequencies, computed from the config, never saved) is built again on the CPU and its buffers copied over."""
    import torch

    for name, module in model.named_modules():
        own = dict(module.named_buffers(recurse=False))
        if not own:
            continue
        assert hasattr(module, "config"), f"{name} ({type(module).__name__}) holds buffers rlx cannot compute"
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        for key, buf in fresh.named_buffers(recurse=False):
            own[key].copy_(buf)


def set_stop_rate(model, eos_id: int, length: int, reach: float, sequences: int = 16, tokens: int = 256) -> float:
    """Make the untied head end responses at widely spread lengths, a share `reach` of them running to `length`
    tokens: no token's logit reads the final hidden state's first coordinate z except EOS's, whose logit is
    beta * z. z varies little within a sequence and much between sequences, so each response gets its own stopping
    rate. beta is chosen (bisection) from the hidden states of `sequences` random sequences of `tokens` tokens (what
    a random-weight model reads and writes: near-uniform ids): each sequence's mean hazard h, and the share
    mean(exp(-length * h)) of responses that run to `length`. Returns beta."""
    import torch

    head = model.get_output_embeddings().weight
    assert head.data_ptr() != model.get_input_embeddings().weight.data_ptr(), "needs tie_word_embeddings=False"
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (sequences, tokens), generator=g)
    with torch.no_grad():
        head[:, 0] = 0
        head[eos_id] = 0
        zs, rests = [], []
        for row in ids.split(4):
            h = model.model(input_ids=row).last_hidden_state.float()
            logits = h @ head.float().T
            logits[..., eos_id] = float("-inf")
            zs.append(h[..., 0])
            rests.append(torch.logsumexp(logits, dim=-1))
        z, rest = torch.cat(zs), torch.cat(rests)
        assert z.isfinite().all() and rest.isfinite().all(), "the stop rate's hidden states are not finite"

        def reaching(beta: float) -> float:
            hazard = -torch.log1p(-torch.sigmoid(beta * z - rest).clamp(max=1 - 1e-6)).mean(dim=1)
            return torch.exp(-length * hazard).mean().item()

        top = 200.0
        lo, hi = 0.0, top
        for _ in range(60):
            beta = (lo + hi) / 2
            lo, hi = (beta, hi) if reaching(beta) > reach else (lo, beta)
        assert 1e-3 < beta < top - 1e-3, f"no stop rate reaches {reach} at {length} tokens (beta {beta})"
        head[eos_id, 0] = beta
    return beta


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlx.models.random_weights", description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES), help="the dimensions to write")
    parser.add_argument("dir", nargs="?", default=None, help="where to write (default: rlx's model cache)")
    args = parser.parse_args()
    print(random_model_dir(args.shape, args.dir))
