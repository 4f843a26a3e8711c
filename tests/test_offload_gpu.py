"""GPU tests of rlx.offload (streams, pinned pool): `pytest -m gpu tests/test_offload_gpu.py`.

Imports only torch, transformers, pytest and rlx.offload, so it runs on a box without ray/hydra/vllm.
"""
from __future__ import annotations

import os
import socket

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch
import torch.nn.functional as F

from rlx.offload import ActivationOffloadConfig, apply_activation_offload

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
transformers = pytest.importorskip("transformers")


def qwen2(layers=6, seed=0, attn="eager", dtype=torch.float32):
    cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=768, num_hidden_layers=layers,
                                   num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                                   attn_implementation=attn, use_cache=False)
    torch.manual_seed(seed)
    m = transformers.Qwen2ForCausalLM(cfg).to(device="cuda", dtype=dtype)
    m.config._attn_implementation = attn
    return m.train()


def slow_down(model):
    """Make the compute stream lag the host, so a missing stream wait shows up as corrupted data."""
    for layer in model.model.layers:
        orig = layer.mlp.forward

        def fwd(x, _orig=orig):
            torch.cuda._sleep(200_000)
            return _orig(x)
        layer.mlp.forward = fwd


def run(model, off=None, steps=3, lens=(384, 512)):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    losses, grads = [], []
    for _ in range(steps):
        for n in lens:
            ids = torch.randint(0, 1000, (2, n), generator=g).cuda()
            ctx = off.activate() if off is not None else torch.enable_grad()
            with ctx:
                loss = F.cross_entropy(model(input_ids=ids).logits.flatten(0, 1).float(), ids.flatten()) / len(lens)
                loss.backward()
            losses.append(loss.item())
        grads.append([(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
                      for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads


@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("keep_last", [0, 1])
def test_cuda_bitwise_with_streams(ckpt, keep_last):
    ref, m = qwen2(), qwen2()
    slow_down(ref), slow_down(m)
    off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0, keep_last_layers=keep_last,
                                                              offload_head=keep_last == 0), ckpt)
    la, ga = run(ref)
    lb, gb = run(m, off)
    assert la == lb
    for s, (x, y) in enumerate(zip(ga, gb)):
        for i, (u, v) in enumerate(zip(x, y)):
            assert torch.equal(u, v), (s, i, (u - v).abs().max().item())
    st = off.stats()
    assert st["offloaded_bytes_last_step"] > 0 and all(c.is_pinned() for c in off.pool.chunks), st


@pytest.mark.parametrize("mode", ["offload", "offload_rmlp", "offload_ckpt"])
def test_cuda_bf16_bitwise_narrowed(mode):
    """bfloat16 model: RMSNorm's float32 upcasts travel narrowed and are widened on the H2D stream; bitwise."""
    ref, m = qwen2(dtype=torch.bfloat16), qwen2(dtype=torch.bfloat16)
    slow_down(ref), slow_down(m)
    off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0, recompute_mlp=mode == "offload_rmlp"),
                                   mode == "offload_ckpt")
    la, ga = run(ref)
    lb, gb = run(m, off)
    assert la == lb
    assert all(torch.equal(u, v) for x, y in zip(ga, gb) for u, v in zip(x, y))
    st = off.stats()
    assert st["moved_bytes_last_step"] > 0, st
    if mode != "offload_ckpt":
        assert st["moved_bytes_last_step"] < st["offloaded_bytes_last_step"], st
    if mode == "offload":  # SwiGLU's silu/mul outputs were rebuilt on the H2D stream, not copied
        assert st["rebuilt_bytes_last_step"] > 0, st


def test_memory_saved_and_pool_stable():
    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    m = qwen2(layers=8, attn="sdpa", dtype=torch.bfloat16)
    ids = torch.randint(0, 1000, (1, 4096), device="cuda")

    def step(ctx):
        with ctx:
            F.cross_entropy(m(input_ids=ids).logits.flatten(0, 1).float(), ids.flatten()).backward()
        m.zero_grad(set_to_none=False)

    step(torch.enable_grad())
    p_none = peak(lambda: step(torch.enable_grad()))
    off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0), False)
    step(off.activate())
    p_off = peak(lambda: step(off.activate()))
    sizes = []
    for _ in range(5):
        step(off.activate())
        sizes.append(off.stats()["pool_bytes"])
    assert p_off < 0.6 * p_none, (p_off, p_none)
    assert len(set(sizes)) == 1, sizes
    off.remove()
    offc = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0), True)
    step(offc.activate())
    p_offc = peak(lambda: step(offc.activate()))
    assert p_offc < p_off, (p_offc, p_off)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp2_cuda_bitwise():
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    own = not torch.distributed.is_initialized()  # another test module may have set up world size 1 already
    if own:
        torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1)
    assert torch.distributed.get_world_size() == 1
    try:
        mesh = init_device_mesh("cuda", (1,))
        out = []
        for mode in ("none", "offload", "offload_ckpt"):
            m = qwen2()
            for layer in m.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
            off = None if mode == "none" else apply_activation_offload(
                m, ActivationOffloadConfig(min_tensor_bytes=0), mode == "offload_ckpt")
            out.append(run(m, off, steps=2))
        for la, ga in out[1:]:
            assert la == out[0][0]
            assert all(torch.equal(u, v) for x, y in zip(out[0][1], ga) for u, v in zip(x, y))
    finally:
        if own:
            torch.distributed.destroy_process_group()
