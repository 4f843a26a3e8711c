"""End-to-end half of tests/unit/test_ops.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import copy
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import pytest
import torch
from rlx.ops import apply_tiled_mlp, log_probs_from_hidden
from conftest import free_port as _free_port
import transformers  # noqa: E402 - a dependency of rlx (pyproject), never skipped
from unit.test_ops import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _fsdp_worker,
    _head_inputs,
    _peak,
)


def test_tiled_mlp_fsdp1_fsdp2_bitwise(tiny_model_path):
    torch.multiprocessing.spawn(_fsdp_worker, args=(2, _free_port(), tiny_model_path), nprocs=2, join=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_head_cuda_bf16_peak():
    n, h, v = 4096, 1024, 65536
    hidden, weight, b, targets = [None if t is None else t.detach().cuda() for t in
                                  _head_inputs(n=n, h=h, v=v, dtype=torch.bfloat16, bias=False)]
    hidden.requires_grad_(), weight.requires_grad_()
    results = {}

    def run(chunk):
        lp, ent = log_probs_from_hidden(hidden, weight, None, targets, 0.7, chunk_size=chunk, with_entropy=True)
        (lp.sum() - 0.01 * ent.sum()).backward()
        results[chunk] = (lp.detach(), ent.detach(), hidden.grad.float(), weight.grad.float())
        hidden.grad = weight.grad = None

    full, fused = _peak(lambda: run(None)), _peak(lambda: run(512))
    print(f"\nfused head peak: full {full / 2**30:.2f} GiB, chunk 512 {fused / 2**30:.2f} GiB")
    assert fused < full / 4
    for a, r in zip(results[512], results[None]):
        assert torch.isfinite(a).all()
        assert (a - r).abs().max() <= 2e-2 * max(r.abs().max().item(), 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_mlp_cuda_peak(dtype):
    cfg = transformers.Qwen2Config(hidden_size=1024, intermediate_size=4096)
    torch.manual_seed(0)
    ref = transformers.models.qwen2.modeling_qwen2.Qwen2MLP(cfg).to("cuda", dtype)
    layer = torch.nn.Module()
    layer.mlp = copy.deepcopy(ref)
    apply_tiled_mlp([layer], 2048)
    x = torch.randn(2, 16384, 1024, device="cuda", dtype=dtype, requires_grad=True)
    grads = {}

    def run(mlp, key):
        mlp(x).float().square().mean().backward()
        grads[key] = [x.grad.float()] + [p.grad.float() for p in mlp.parameters()]
        x.grad = None

    untiled, tiled = _peak(lambda: run(ref, "ref")), _peak(lambda: run(layer.mlp, "tiled"))
    print(f"\ntiled MLP peak ({dtype}): untiled {untiled / 2**20:.0f} MiB, tile 2048 {tiled / 2**20:.0f} MiB")
    assert tiled < untiled / 2
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for a, r in zip(grads["tiled"], grads["ref"]):
        assert (a - r).abs().max() <= tol * r.abs().max()
