"""actor_rollout_ref.model.lora_adapter_path: LoRA starts from a saved peft adapter (verl's key), on the built-in tiny
model: the adapter's rank, alpha, targets and weights are taken; a mismatch is an error naming the key."""
from __future__ import annotations

import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

TARGETS = ["q_proj", "v_proj", "down_proj"]


def _base():
    from transformers import AutoModelForCausalLM

    from rlx.models import resolve_model_path

    return AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin://tiny-qwen2"), dtype=torch.float32)


def _known(name: str, shape) -> torch.Tensor:
    """A nonzero value per adapter weight that depends on its name (so a swap of two modules shows)."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(name)) % 10_000
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A peft adapter (r=4, alpha=12, on q/v/down) with known nonzero weights, saved by peft itself: the directory
    and {peft file name: tensor}."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("adapter")
    peft_model = get_peft_model(_base(), LoraConfig(r=4, lora_alpha=12, target_modules=TARGETS, lora_dropout=0.0))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if ".lora_" in n:
                p.copy_(_known(n, p.shape))
    peft_model.save_pretrained(str(out))
    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert len(tensors) == 4 * 3 * 2  # 4 layers x 3 projections x (A, B)
    return out, tensors


def _cfg(path, **kw):
    from rlx.config.schema import ModelConfig

    return ModelConfig(path="builtin://tiny-qwen2", lora_adapter_path=str(path), **kw)


def test_start_from_saved_adapter(saved):
    """The adapter's weights land in the model's adapters exactly; its rank, alpha and targets are used although
    lora_rank is 0 and the config's target_modules say all-linear (verl's behaviour); the forward is the peft one."""
    from peft import PeftModel

    from rlx.engine.lora import adapter_params, apply_lora, lora_enabled

    path, tensors = saved
    cfg = _cfg(path)
    assert cfg.lora_rank == 0 and lora_enabled(cfg)
    model = _base()
    spec = apply_lora(model, cfg)
    assert (spec.rank, spec.alpha, spec.scaling) == (4, 12.0, 3.0)
    assert len(spec.modules) == 12 and all(m.rsplit(".", 1)[-1] in TARGETS for m in spec.modules)
    mine = dict(adapter_params(model.named_parameters()))
    assert sorted(mine) == sorted(tensors)
    for k, t in tensors.items():
        assert torch.equal(mine[k], t), k
        assert t.abs().sum() > 0
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 24 and all(".lora_" in n for n in trainable)
    # the same logits as peft's own loader on the same base
    ref = PeftModel.from_pretrained(_base(), str(path))
    ids = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, ref(ids).logits, atol=1e-5)
    # a matching lora_rank / lora_alpha is accepted
    apply_lora(_base(), _cfg(path, lora_rank=4, lora_alpha=12))


def _copy(src, dst, edit_config=None, edit_weights=None):
    from safetensors.torch import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    cfg = json.loads((src / "adapter_config.json").read_text())
    if edit_config:
        edit_config(cfg)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(src / "adapter_model.safetensors"))
    if edit_weights:
        edit_weights(tensors)
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    return dst


def test_adapter_mismatch_errors(saved, tmp_path):
    from rlx.engine.lora import apply_lora
    from rlx.engine.lora_adapter import read_adapter

    path, _ = saved
    key = "actor_rollout_ref.model.lora_adapter_path"
    with pytest.raises(ValueError, match=r"lora_rank=8, lora_alpha=16 disagree with the adapter .* \(r=4, "
                                         r"lora_alpha=12\).*lora_rank=0"):
        read_adapter(_cfg(path, lora_rank=8))
    with pytest.raises(ValueError, match=r"lora_rank=4, lora_alpha=16 disagree"):
        apply_lora(_base(), _cfg(path, lora_rank=4))
    with pytest.raises(ValueError, match=rf"{key}='.*nowhere' is not a directory"):
        read_adapter(_cfg(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"adapter_config.json is missing or unreadable"):
        read_adapter(_cfg(tmp_path / "empty"))

    def dora(c):
        c["use_dora"] = True
    with pytest.raises(ValueError, match=r"sets \{'use_dora': True\}, which rlx's LoRA does not support"):
        read_adapter(_cfg(_copy(path, tmp_path / "dora", edit_config=dora)))

    def other_model(c):  # an adapter of a model whose projections are called differently
        c["target_modules"] = ["qkv_proj"]
    with pytest.raises(ValueError, match=r"adapter_config.json target_modules=\['qkv_proj'\]: \['qkv_proj'\] name no "
                                         r"module"):
        apply_lora(_base(), _cfg(_copy(path, tmp_path / "other", edit_config=other_model)))

    def wider(t):  # rank 8 weights under a rank-4 config
        for k in list(t):
            t[k] = torch.zeros(8, t[k].shape[1]) if ".lora_A." in k else torch.zeros(t[k].shape[0], 8)
    with pytest.raises(ValueError, match=r"weight shapes do not fit the model"):
        apply_lora(_base(), _cfg(_copy(path, tmp_path / "wider", edit_weights=wider)))

    def drop_layer(t):
        for k in [k for k in t if ".layers.3." in k]:
            del t[k]
    with pytest.raises(ValueError, match=r"6 missing \(e.g. \['base_model.model.model.layers.3.mlp.down_proj"):
        apply_lora(_base(), _cfg(_copy(path, tmp_path / "partial", edit_weights=drop_layer)))


def test_adapter_path_before_ray(saved, tmp_path):
    """The driver's checks: the preflight reads the adapter (a bad one stops the job before Ray), validation
    accepts lora_rank 0 with an adapter."""
    from conftest import load_config

    from rlx.trainer.preflight import PreflightError, preflight

    path, _ = saved
    ok = load_config(["trainer.device=cpu", f"actor_rollout_ref.model.lora_adapter_path={path}"])
    preflight(ok)
    bad = load_config(["trainer.device=cpu", f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'none'}"])
    with pytest.raises(PreflightError, match=r"actor_rollout_ref.model.lora_adapter_path='.*none' is not a directory"):
        preflight(bad)
    with pytest.raises(ValueError, match=r"critic.model.lora_adapter_path"):
        load_config(["trainer.device=cpu", f"critic.model.lora_adapter_path={path}"])


# ---------------------------------------------------------------- through the engine (FSDP1, FSDP2, 2 gloo ranks)
def _round_trip(rank: int, strategy: str, root: str):
    """rlx's own lora_adapter/ export of a trained policy, started from by a fresh engine with lora_rank 0: the same
    parameters (adapters and frozen base) and the same log-probs, bit for bit; the adapter-off ref is the base."""
    from unit.test_lora import _batch, _engine, _params, _train_step

    from rlx import checkpoint as ckpt

    a = _engine(strategy)
    for step in (1, 2):
        _train_step(a, step, rank)
    out = os.path.join(root, "actor")
    ckpt.save_engine(a, out, contents=["model", "lora_adapter"])
    adapter = os.path.join(out, ckpt.ADAPTER_DIR)
    b = _engine(strategy, lora=False, lora_adapter_path=adapter)
    assert b.lora is not None and (b.lora.rank, b.lora.alpha) == (4, 8.0)
    pa, pb = _params(a), _params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    assert any(".lora_B." in k and pa[k].abs().sum() > 0 for k in pa)  # trained: lora_B no longer zero
    batch = _batch(5, rank)
    assert torch.equal(a.compute_log_prob(batch, 2)["log_probs"], b.compute_log_prob(batch, 2)["log_probs"])
    base = _engine(strategy, role="ref", lora=False)
    with b.adapters_disabled():
        assert torch.equal(b.compute_log_prob(batch, 2)["log_probs"], base.compute_log_prob(batch, 2)["log_probs"])
