"""Packed attention on CUDA: torch's varlen kernel (one call a row) against SDPA per sequence, forward and backward.

Both run in bf16; each is compared with the same attention computed in float32, and the varlen kernel must be as
close to it as the per-sequence path is (the bf16 noise floor), for GQA (Qwen2.5-0.5B's 14 query / 2 key-value heads)
and for plain multi-head attention. Then a whole packed model: log-probs and gradients through `rlx_packed_varlen`
against `rlx_packed_sdpa`.
"""
import pytest
import torch

pytestmark = pytest.mark.gpu


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref).norm() / ref.norm()).item()


def _row(heads: int, kv_heads: int, lens: list[int], seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lens)
    q = torch.randn(1, heads, total, 64, device="cuda", generator=g)
    k = torch.randn(1, kv_heads, total, 64, device="cuda", generator=g)
    v = torch.randn(1, kv_heads, total, 64, device="cuda", generator=g)
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    return q, k, v, cu


def _run(kernel: str, q, k, v, cu, grad_out, dtype):
    from rlx.engine.attention import packed_attention

    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    longest = int((cu[1:] - cu[:-1]).max())
    out = packed_attention(*leaves, cu, longest, 0.0, None, kernel)
    out.backward(grad_out.to(dtype))
    return [out.detach()] + [t.grad for t in leaves]


def test_the_machine_picks_the_varlen_kernel():
    import importlib.util

    from rlx.engine.attention import PACKED_VARLEN, packed_attn_implementation, packed_kernel

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed: transformers' flash_attention_2 is the packed kernel")
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("varlen_attn needs compute capability 8.0")
    assert packed_kernel("cuda") == "varlen"
    assert packed_attn_implementation("cuda") == PACKED_VARLEN


@pytest.mark.parametrize("heads,kv_heads", [(14, 2), (8, 8)], ids=["gqa", "mha"])
def test_varlen_equals_per_sequence_at_the_bf16_noise_floor(heads, kv_heads):
    torch.manual_seed(0)
    lens = torch.randint(1, 400, (40,)).tolist()
    lens[:3] = [1, 2, 400]  # the shortest rows and one at the job's response limit
    q, k, v, cu = _row(heads, kv_heads, lens, seed=1)
    grad_out = torch.randn(1, sum(lens), heads, 64, device="cuda")
    ref = _run("sdpa-per-sequence", q, k, v, cu, grad_out, torch.float32)  # float32 reference
    sdpa = _run("sdpa-per-sequence", q, k, v, cu, grad_out, torch.bfloat16)
    varlen = _run("varlen", q, k, v, cu, grad_out, torch.bfloat16)
    for name, r, s, x in zip(("out", "dq", "dk", "dv"), ref, sdpa, varlen):
        assert torch.isfinite(x).all(), name
        floor = _rel(s, r)
        assert _rel(x, r) <= 2 * floor + 1e-3, (name, _rel(x, r), floor)
        assert floor < 5e-2, (name, floor)  # the reference is right: bf16 lands near 4e-3


def test_varlen_differs_from_one_unpacked_causal_call():
    """The kernel must not attend across sequences: the same row as one causal sequence gives another result."""
    from rlx.engine.attention import packed_attention

    q, k, v, cu = _row(4, 4, [50, 70], seed=2)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    packed = packed_attention(q, k, v, cu, 70, 0.0, None, "varlen")
    whole = packed_attention(q, k, v, torch.tensor([0, 120], device="cuda", dtype=torch.int32), 120, 0.0, None,
                             "varlen")
    torch.testing.assert_close(packed[:, :50], whole[:, :50])  # the first sequence sees the same keys
    assert (packed[:, 50:] - whole[:, 50:]).abs().max() > 1e-2


def test_a_packed_model_gives_the_same_log_probs_and_gradients():
    from transformers import AutoModelForCausalLM

    from rlx.engine.attention import PACKED_SDPA, PACKED_VARLEN, register_packed_attention
    from rlx.models import local_model_path

    register_packed_attention()
    path = local_model_path("builtin://tiny-qwen2", False, "actor_rollout_ref.model.path")
    lens = [37, 120, 5, 200, 64]
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    ids = torch.randint(3, 250, (1, sum(lens)), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    pos = torch.cat([torch.arange(n) for n in lens]).cuda()[None]
    results = {}
    for impl, dtype in ((PACKED_SDPA, torch.float32), (PACKED_SDPA, torch.bfloat16), (PACKED_VARLEN, torch.bfloat16)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=impl).cuda()
        logits = model(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                       max_length_q=max(lens), max_length_k=max(lens)).logits.float()
        logp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        logp.sum().backward()
        results[impl, dtype] = (logp.detach(), torch.cat([p.grad.flatten().float() for p in model.parameters()]))
    (lp_r, g_r), (lp_s, g_s), (lp_v, g_v) = results.values()
    # float32 reference: the varlen kernel in bf16 is as close to it as the per-sequence path in bf16
    assert _rel(lp_v, lp_r) <= 2 * _rel(lp_s, lp_r) + 1e-3, (_rel(lp_v, lp_r), _rel(lp_s, lp_r))
    assert _rel(g_v, g_r) <= 2 * _rel(g_s, g_r) + 1e-3, (_rel(g_v, g_r), _rel(g_s, g_r))
