"""End-to-end half of tests/unit/test_triton_head.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import pytest
import torch
pytest.importorskip("triton")
from unit.test_triton_head import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    CPU,
    _actor_worker,
    interpret,
    _inputs,
    _peak,
    _run,
)


@pytest.mark.gpu
@pytest.mark.skipif(CPU, reason="needs CUDA")
@pytest.mark.parametrize("use", ["lp", "lp+ent"])
def test_triton_equals_torch_backend_cuda_fp32(use):
    inputs = _inputs(n=1000, h=64, v=10000, bias=True, device="cuda")
    ref = _run("torch", inputs, 0.7, 256, use)
    out = _run("triton", inputs, 0.7, 256, use)
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=1e-4)
    if "ent" in use:
        torch.testing.assert_close(out[1], ref[1], rtol=0, atol=1e-4)
    for a, r in zip(out[2], ref[2]):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(CPU, reason="needs CUDA")
def test_triton_equals_torch_backend_cuda_bf16_qwen_vocab():
    n, h, v = 4096, 1536, 151936
    inputs = _inputs(n=n, h=h, v=v, dtype=torch.bfloat16, bias=False, device="cuda")
    results, peaks = {}, {}
    for backend in ("torch", "triton"):
        peaks[backend] = _peak(lambda: results.__setitem__(backend, _run(backend, inputs, 0.7, 2048, "lp+ent")))
    print(f"\nbf16 head peak above inputs: torch {peaks['torch'] / 2**30:.2f} GiB, "
          f"triton {peaks['triton'] / 2**30:.2f} GiB")
    ref, out = results["torch"], results["triton"]
    # same bf16 logits in, float32 math: the outputs agree to float32 summation order
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=1e-3)
    torch.testing.assert_close(out[1], ref[1], rtol=0, atol=1e-3)
    for a, r in zip(out[2][:2], ref[2][:2]):  # bf16 gradients: a bf16 ulp of the largest entry
        assert torch.isfinite(a).all()
        assert (a.float() - r.float()).abs().max() <= 1e-2 * r.float().abs().max()
    assert peaks["triton"] < peaks["torch"] / 2


@pytest.mark.skipif(not CPU, reason="the CPU engine over gloo (the GPU engines: tests/e2e/test_engine_gpu.py)")
def test_actor_engine_with_triton_backend_equals_torch():
    """ActorEngine with impl_backend=triton (Triton's interpreter, inherited by the spawned rank): the same log-probs,
    entropy and update metrics as with torch (FSDP2 over gloo, one rank)."""
    from conftest import free_port

    torch.multiprocessing.spawn(_actor_worker, args=(1, free_port()), nprocs=1, join=True)
