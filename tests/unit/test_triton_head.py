"""The fused head's Triton backend (`fused_kernel_options.impl_backend=triton`, rlx.ops.triton_head) against a
hand-computed case and against the torch backend of the same chunked head.

Without CUDA the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`, set here before the kernels are
built): small float32 shapes, tight tolerances, on the CPU. With CUDA (`pytest -m gpu`) the compiled kernels run at
a real model's sizes in bfloat16.
"""
from __future__ import annotations

import importlib
import math
import os
import sys

import pytest
import torch

from ranks import end_rank

CPU = not torch.cuda.is_available()
if CPU:  # TRITON_INTERPRET is read when the kernels are decorated (at import) and while they run (`interpret`)
    _before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        pytest.importorskip("triton")
        if "rlx.ops.triton_head" in sys.modules:
            importlib.reload(sys.modules["rlx.ops.triton_head"])
        from rlx.ops import triton_head
    finally:
        if _before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _before
pytest.importorskip("triton")

from rlx.ops import log_probs_from_hidden, triton_head  # noqa: E402

def _inputs(n=37, h=16, v=300, dtype=torch.float32, bias=True, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g) * 2).to(device, dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h ** 0.5).to(device, dtype).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).to(device, dtype).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,), generator=g).to(device)
    return hidden, weight, b, targets


def _run(backend, inputs, temperature, chunk, use):
    """Outputs and input gradients of the chunked head with `backend`; `use`: which outputs the loss reads."""
    hidden, weight, b, targets = inputs
    for t in (hidden, weight, b):
        if t is not None:
            t.grad = None
    lp, ent = log_probs_from_hidden(hidden, weight, b, targets, temperature, chunk_size=chunk,
                                    with_entropy="ent" in use, backend=backend)
    g = torch.Generator().manual_seed(1)
    loss = 0.0
    if "lp" in use:
        loss = loss + (lp * torch.randn(lp.shape, generator=g).to(lp.device)).sum()
    if "ent" in use:
        loss = loss - 0.3 * (ent * torch.randn(ent.shape, generator=g).to(ent.device)).sum()
    loss.backward()
    grads = [None if t is None else t.grad.detach().clone() for t in (hidden, weight, b)]
    return lp.detach(), None if ent is None else ent.detach(), grads


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    """On the CPU, Triton's interpreter during each test of this module only (the rest of a session is unchanged)."""
    if CPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def small_blocks(monkeypatch):
    """A vocabulary block of 64 entries: V=300 takes 5 steps of the online logsumexp, the last one partial."""
    monkeypatch.setattr(triton_head, "BLOCK_V", 64)


def test_interpreter_runs_the_kernels_on_cpu():
    if CPU:
        assert type(triton_head._lse_entropy_fwd).__name__ == "InterpretedFunction"


def test_hand_computed_logprob_entropy_and_gradient(small_blocks):
    # W = I, no bias, T = 1: the logits are h = [0, ln 2, ln 3] -> p = [1/6, 2/6, 3/6], lse = ln 6
    hidden = torch.tensor([[0.0, math.log(2), math.log(3)]], requires_grad=True)
    weight = torch.eye(3, requires_grad=True)
    lp, ent = log_probs_from_hidden(hidden, weight, None, torch.tensor([2]), 1.0, chunk_size=4, with_entropy=True,
                                    backend="triton")
    assert lp.item() == pytest.approx(-math.log(2), abs=1e-6)  # ln(3/6)
    assert ent.item() == pytest.approx(-(1 / 6 * math.log(1 / 6) + 1 / 3 * math.log(1 / 3) + 1 / 2 * math.log(1 / 2)),
                                       abs=1e-6)
    lp.sum().backward()
    # d log p_2 / d logits = onehot(2) - p; W = I so the hidden gradient is the same, and dW = outer(dz, h)
    dz = torch.tensor([-1 / 6, -2 / 6, 3 / 6])
    torch.testing.assert_close(hidden.grad, dz.unsqueeze(0), rtol=0, atol=1e-6)
    torch.testing.assert_close(weight.grad, torch.outer(dz, hidden.detach()[0]), rtol=0, atol=1e-6)


def test_temperature_and_entropy_gradient_hand_computed(small_blocks):
    # logits [0, ln 3] at T = 0.5 -> z = [0, 2 ln 3], p = [1/10, 9/10]; H = sum p ln(1/p), dH/dz_i = -p_i (z_i - E[z])
    hidden = torch.tensor([[0.0, math.log(3)]], requires_grad=True)
    weight = torch.eye(2)
    lp, ent = log_probs_from_hidden(hidden, weight, None, torch.tensor([0]), 0.5, chunk_size=1, with_entropy=True,
                                    backend="triton")
    p = torch.tensor([0.1, 0.9])
    z = torch.tensor([0.0, 2 * math.log(3)])
    assert lp.item() == pytest.approx(math.log(0.1), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.1 * math.log(0.1) + 0.9 * math.log(0.9)), abs=1e-6)
    ent.sum().backward()
    expected = -p * (z - (p * z).sum()) / 0.5  # d z / d logits = 1 / T
    torch.testing.assert_close(hidden.grad[0], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunk, bias, use", [(5, True, "lp+ent"), (64, False, "lp+ent"), (5, False, "lp"),
                                              (64, True, "ent")])
def test_triton_equals_torch_backend_fp32(small_blocks, chunk, bias, use):
    inputs = _inputs(bias=bias)
    ref = _run("torch", inputs, 0.7, chunk, use)
    out = _run("triton", inputs, 0.7, chunk, use)
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=2e-5)
    if "ent" in use:
        torch.testing.assert_close(out[1], ref[1], rtol=0, atol=2e-5)
    for a, r in zip(out[2], ref[2]):
        if r is None:
            assert a is None
        else:
            torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_no_grad_and_batch_shape(small_blocks):
    hidden, weight, b, targets = _inputs(n=12)
    with torch.no_grad():
        ref = log_probs_from_hidden(hidden.view(3, 4, -1), weight, b, targets.view(3, 4), 1.3, chunk_size=5,
                                    with_entropy=True, backend="torch")
        out = log_probs_from_hidden(hidden.view(3, 4, -1), weight, b, targets.view(3, 4), 1.3, chunk_size=5,
                                    with_entropy=True, backend="triton")
    assert out[0].shape == (3, 4) and out[1].shape == (3, 4) and out[0].dtype == torch.float32
    for a, r in zip(out, ref):
        torch.testing.assert_close(a, r, rtol=0, atol=2e-5)


def test_target_outside_the_vocabulary_gives_nan(small_blocks):
    hidden, weight, b, targets = _inputs(n=4)
    targets = targets.clone()
    targets[1] = weight.shape[0]
    with torch.no_grad():
        lp, _ = log_probs_from_hidden(hidden, weight, b, targets, 1.0, chunk_size=4, with_entropy=False,
                                      backend="triton")
    assert torch.isnan(lp[1]) and torch.isfinite(lp[[0, 2, 3]]).all()


# ================================================================ CUDA: compiled kernels (pytest -m gpu)
def _peak(fn) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


# ================================================================ the key: validation before Ray, the engine's head
KEY = "actor_rollout_ref.model.fused_kernel_options.impl_backend"


def test_triton_backend_refused_on_cpu_without_the_interpreter(monkeypatch):
    from conftest import load_config, refusal

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    msg = refusal(["trainer.device=cpu", f"{KEY}=triton"])  # the preflight's probe (validation does no IO)
    assert f"{KEY}=triton runs Triton kernels, which need a GPU, but trainer.device=cpu" in msg, msg
    assert f"Fix: {KEY}=torch" in msg and "TRITON_INTERPRET=1" in msg
    # the unfused head has no backend: the key is not checked against the device there (as verl ignores it)
    cfg = load_config(["trainer.device=cpu", f"{KEY}=triton", "actor_rollout_ref.model.use_fused_kernels=False"])
    assert cfg.actor_rollout_ref.model.fused_kernel_options.impl_backend == "triton"
    from rlx.trainer.probes import machine_problems

    assert machine_problems(cfg) == []


def test_triton_backend_accepted_under_the_interpreter_and_other_values_refused(monkeypatch):
    from conftest import load_config

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = load_config(["trainer.device=cpu", f"{KEY}=triton"])
    assert cfg.actor_rollout_ref.model.fused_kernel_options.impl_backend == "triton"
    with pytest.raises(ValueError, match=rf"{KEY}='cuda' is not valid; choose one of \['torch', 'triton'\]"):
        load_config(["trainer.device=cpu", f"{KEY}=cuda"])


def test_triton_backend_without_the_package_names_the_fix(monkeypatch):
    import importlib.util

    from rlx.config.device import triton_head_problem

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    assert triton_head_problem("cuda") == (f"{KEY}=triton needs the triton package (CUDA builds of torch install it). "
                                           f"Fix: pip install triton, or {KEY}=torch.")


def _tiny_causal_lm():
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def test_engine_head_picks_the_backend(monkeypatch, small_blocks):
    """apply_token_head with the key's backend: the same log-probs, entropy and parameter gradients as torch's."""
    import copy
    from types import SimpleNamespace

    from rlx.engine.heads import apply_token_head, fused_head_backend

    model_cfg = SimpleNamespace(fused_kernel_options=SimpleNamespace(impl_backend="triton"))
    device = torch.device("cuda" if not CPU else "cpu")
    assert fused_head_backend(model_cfg, device) == "triton"
    if CPU:
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(ValueError, match=f"{KEY}=triton runs Triton kernels, which need a GPU"):
            fused_head_backend(model_cfg, device)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    base = _tiny_causal_lm().to(device)
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(3)).to(device)
    pos = torch.arange(9, device=device).expand(2, 9)
    index = torch.tensor([2, 3, 4, 11, 12, 13, 14], device=device)
    targets = ids.reshape(-1)[index + 1]
    results = {}
    for backend in ("torch", "triton"):
        model = copy.deepcopy(base)
        apply_token_head(model, "actor", 3, backend=backend)
        lp, ent = model(ids, pos, torch.ones_like(ids), index, targets, temperature=0.8, with_entropy=True)
        (lp.sum() + 0.1 * ent.sum()).backward()
        results[backend] = (lp.detach(), ent.detach(), [p.grad for p in model.parameters()])
    (lp_t, ent_t, g_t), (lp_x, ent_x, g_x) = results["torch"], results["triton"]
    torch.testing.assert_close(lp_x, lp_t, rtol=0, atol=2e-5)
    torch.testing.assert_close(ent_x, ent_t, rtol=0, atol=2e-5)
    for a, r in zip(g_x, g_t):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)


def _actor_worker(rank, world, port):
    from unit.test_batch_shaping import FUSED, _actor, make_batch

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        batch = make_batch(rows=4, seed=rank)
        over = FUSED + ["actor_rollout_ref.actor.entropy_coeff=0.01",
                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
        from rlx.ops import triton_head

        calls = []  # which kernels ran: the engine must pick the key's backend
        for name in ("lse_entropy", "grad_logits_"):
            def counted(*a, _f=getattr(triton_head, name), _name=name, **k):
                calls.append(_name)
                return _f(*a, **k)
            setattr(triton_head, name, counted)
        out = {}
        for backend in ("torch", "triton"):
            engine = _actor("fsdp2", over + [f"{KEY}={backend}"])
            lp = engine.compute_log_prob(batch, 2, with_entropy=True)
            out[backend] = (dict(lp.tensors), engine.update_policy(batch))
            assert (set(calls) == {"lse_entropy", "grad_logits_"}) == (backend == "triton"), (backend, set(calls))
        (lp_t, m_t), (lp_x, m_x) = out["torch"], out["triton"]
        for k in lp_t:
            torch.testing.assert_close(lp_x[k], lp_t[k], rtol=0, atol=2e-5)
        assert m_t.keys() == m_x.keys()
        keys = [k for k in m_t if k.startswith("actor/")]  # the losses, the entropy, the gradient norm (not perf/)
        assert {"actor/entropy", "actor/grad_norm", "actor/pg_loss"} <= set(keys), keys
        for k in keys:
            assert m_x[k] == pytest.approx(m_t[k], rel=1e-4, abs=1e-6), (k, m_x[k], m_t[k])
    finally:
        end_rank()
