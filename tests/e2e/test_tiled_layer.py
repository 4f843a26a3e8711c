"""End-to-end half of tests/unit/test_tiled_layer.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import copy
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import pytest
import torch
from rlx.ops import apply_tiled_layers
import transformers  # noqa: E402 - a dependency of rlx (pyproject), never skipped
from unit.test_tiled_layer import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _fsdp_worker,
)


def test_tiled_layers_fsdp1_fsdp2_offload_ckpt(tiny_model_path):
    from conftest import free_port as _free_port
    torch.multiprocessing.spawn(_fsdp_worker, args=(2, _free_port(), tiny_model_path), nprocs=2, join=True)


# ---------------------------------------------------------------- CUDA: same results, lower peak (pytest -m gpu)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiled_layer_cuda_bf16_peak_and_noise_floor():
    """One Qwen2 layer (hidden 1024, 8 heads, 2 KV heads, intermediate 4096), bf16, 32768 tokens: the layer
    checkpointed with a tiled MLP (the scheme before) vs the tiled layer. The tiled layer's backward peak is
    lower; outputs and gradients agree within bf16 noise (2e-2 of the largest value, as the fused head)."""
    from torch.utils.checkpoint import checkpoint

    from rlx.ops import apply_tiled_mlp

    cfg = transformers.Qwen2Config(hidden_size=1024, intermediate_size=4096, num_attention_heads=8,
                                   num_key_value_heads=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    mod = transformers.models.qwen2.modeling_qwen2
    ref = mod.Qwen2DecoderLayer(cfg, 0).to("cuda", torch.bfloat16).train()
    tiled = copy.deepcopy(ref)
    apply_tiled_mlp([ref], 4096)
    apply_tiled_layers([tiled], 4096)
    rotary = mod.Qwen2RotaryEmbedding(cfg).to("cuda")
    x = torch.randn(1, 32768, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(32768, device="cuda")[None]
    pe = rotary(x, pos)
    results = {}

    def run(name, fn):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = fn()
        y.float().square().mean().backward()
        torch.cuda.synchronize()
        layer = ref if name == "ckpt" else tiled
        results[name] = [y.detach().float(), x.grad.float()] + [p.grad.float() for p in layer.parameters()]
        x.grad = None
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    kw = dict(attention_mask=None, position_ids=pos, position_embeddings=pe)
    before = run("ckpt", lambda: checkpoint(ref, x, use_reentrant=False, **kw))
    after = run("tiled", lambda: tiled(x, **kw))
    print(f"\none layer, 32768 tokens: checkpointed + tiled MLP {before:.0f} MiB, tiled layer {after:.0f} MiB")
    assert after < before
    for a, r in zip(results["tiled"], results["ckpt"]):
        assert torch.isfinite(a).all()
        assert (a - r).abs().max() <= 2e-2 * max(r.abs().max().item(), 1e-6)
