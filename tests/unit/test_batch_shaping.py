"""Batch shaping and the long-response head at the engine level (real FSDP1/FSDP2 over gloo, two ranks):

* remove padding: log-probs, entropy, values and one update's gradients equal the padded path (fp32, 1e-5);
* micro-batch splits (even, uneven, dynamic by token budget): gradients equal the one-micro-batch gradient (1e-6)
  for every loss_agg_mode (verl's five), actor and critic, with activation offload off and on;
* the fused (chunked) head: log-probs, entropy and gradients equal the full-logits head (1e-5), temperature != 1,
  chunks smaller and larger than the response.
"""
from __future__ import annotations


import pytest
import torch

from ranks import end_rank
from rlx.protocol import Batch
from rlx.engine.packing import balanced_partition, micro_batches, restore_order, token_inputs

MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def lengths_batch(prompt_lens, resp_lens, prompt=6, resp=9, seed=0, g: torch.Generator | None = None) -> Batch:
    """Rows with the given prompt and response lengths (left-padded prompts, right-padded responses) and PPO/critic
    fields drawn from `g` (else a generator seeded with `seed`)."""
    g = g if g is not None else torch.Generator().manual_seed(seed)
    rows = len(prompt_lens)
    pm, rm = torch.zeros(rows, prompt, dtype=torch.long), torch.zeros(rows, resp, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        pm[i, prompt - p:] = 1
        rm[i, :r] = 1
    am = torch.cat([pm, rm], 1)
    ids = torch.randint(3, 255, (rows, prompt + resp), generator=g) * am
    return Batch({"input_ids": ids, "attention_mask": am, "position_ids": (am.cumsum(1) - 1).clamp(min=0),
                  "responses": ids[:, prompt:], "response_mask": rm,
                  "old_log_probs": -5.5 + 0.1 * torch.randn(rows, resp, generator=g),
                  "advantages": torch.randn(rows, resp, generator=g),
                  "ref_log_prob": -5.5 + 0.1 * torch.randn(rows, resp, generator=g),
                  "values": 0.1 * torch.randn(rows, resp, generator=g),
                  "returns": torch.randn(rows, resp, generator=g)})


def make_batch(rows=8, prompt=6, resp=9, seed=0) -> Batch:
    """Left-padded prompts and right-padded responses of random lengths, with PPO/critic fields."""
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(2, prompt + 1, (rows,), generator=g)
    rlen = torch.randint(1, resp + 1, (rows,), generator=g)
    rlen[0] = resp  # one full-length response
    return lengths_batch(plen.tolist(), rlen.tolist(), prompt, resp, g=g)


# ---- units ----------------------------------------------------------------------------------------------------
def test_balanced_partition_respects_budget_and_balances():
    lengths = [30, 5, 12, 18, 7, 25, 3, 9]
    groups = balanced_partition(lengths, max_tokens=40)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in g) for g in groups]
    assert max(loads) <= 40 and len(groups) == 3, loads  # 109 tokens need 3 micro-batches of <= 40
    assert max(loads) - min(loads) <= max(lengths), loads
    assert balanced_partition([50, 3], max_tokens=10) == [[0], [1]]  # longer than the budget: a group of its own
    exact = balanced_partition(lengths, max_tokens=40, groups=5)  # as many as another rank needs
    assert len(exact) == 5 and sorted(i for g in exact for i in g) == list(range(len(lengths)))


def test_dynamic_micro_batches_restore_order():
    b = make_batch(rows=8)
    mbs, perm = micro_batches(b, max_tokens=24)
    assert all(int(mb["attention_mask"].sum()) <= 24 or len(mb) == 1 for mb in mbs)
    out = Batch.concat([Batch({"x": mb["input_ids"].float().sum(-1)}) for mb in mbs])
    assert torch.equal(restore_order(out, perm)["x"], b["input_ids"].float().sum(-1))
    even, none = micro_batches(b, size=3)
    assert none is None and [len(m) for m in even] == [3, 3, 2]


def test_packed_inputs_restart_positions_and_score_response_tokens():
    b = make_batch(rows=3)
    ti = token_inputs(b, torch.device("cpu"), remove_padding=True)
    kw = ti.kwargs
    valid = b["attention_mask"].bool()
    assert kw["input_ids"].shape == (1, int(valid.sum())) and kw["attention_mask"] is None
    cu = kw["cu_seq_lens"].tolist()
    assert cu == [0] + valid.sum(-1).cumsum(0).tolist()
    for s, e in zip(cu[:-1], cu[1:]):
        assert kw["position_ids"][0, s:e].tolist() == list(range(e - s))
    # the scored position holds the token before each response token; the target is that response token
    flat = kw["input_ids"][0]
    assert torch.equal(kw["targets"], b["responses"][b["response_mask"].bool()])
    assert torch.equal(flat[kw["index"] + 1], kw["targets"])
    padded = token_inputs(b, torch.device("cpu"), remove_padding=False).kwargs
    assert torch.equal(b["input_ids"].reshape(-1)[padded["index"]], flat[kw["index"]])


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_packed_rows_equal_padded_rows(model_type):
    """Remove padding on a decoder that builds one mask (Llama) and one that takes a per-layer-type mapping
    (Qwen2): the packed row's log-probs and entropy equal the padded rows' (rlx's per-sequence SDPA)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlx.engine.attention import packed_attn_implementation
    from rlx.engine.heads import apply_token_head

    b = make_batch(rows=4)
    outs = []
    for packed in (True, False):
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, vocab_size=256, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        cfg._attn_implementation = packed_attn_implementation("cpu") if packed else "sdpa"
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        apply_token_head(model, "actor", chunk_size=None)
        with torch.no_grad():
            outs.append(model(**token_inputs(b, torch.device("cpu"), remove_padding=packed).kwargs,
                              with_entropy=True))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-5, rtol=1e-5)


def test_packed_sdpa_never_uses_cudnn_attention(monkeypatch):
    """Each packed sequence is one SDPA call with its own length; PyTorch's cuDNN backend builds a graph per new
    shape (host-bound, 5-10x slower on an H100 without vLLM in the process), so the packed path runs with cuDNN
    attention switched off and Flash allowed, and leaves the process's settings as they were."""
    import torch.nn.functional as F

    from rlx.engine.attention import _packed_sdpa

    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    q, k, v = torch.randn(1, 4, 7, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    module = torch.nn.Module().eval()
    out, _ = _packed_sdpa(module, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 3, 7], dtype=torch.int32))
    assert seen == [(False, True), (False, True)]  # one call per sequence, cuDNN off, Flash on
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    ref = real(q[:, :, 3:], k.repeat_interleave(2, dim=1)[:, :, 3:], v.repeat_interleave(2, dim=1)[:, :, 3:],
               is_causal=True)
    torch.testing.assert_close(out[:, 3:], ref.transpose(1, 2))


# ---- engines on two ranks ---------------------------------------------------------------------------------------
def _full_grads(module) -> dict:
    out = {}
    for n, p in module.named_parameters():
        g = p.grad
        if g is None:
            continue
        out[n] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return out


def _capture_grads(engine) -> dict:
    """Replace the optimizer step by a capture of the (FSDP-reduced) gradients of each mini-batch."""
    captured: dict = {}

    def step(grad_clip):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if isinstance(engine.module, FSDP):
            with FSDP.summon_full_params(engine.module, with_grads=True):
                captured.update(_full_grads(engine.module))
        else:
            captured.update(_full_grads(engine.module))
        engine.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": 0.0, "skipped_steps": 0.0}

    engine.optimizer_step = step
    return captured


def _cfg(strategy, over):
    from conftest import load_config  # the quickstart config

    base = [f"actor_rollout_ref.actor.strategy={strategy}", "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            "actor_rollout_ref.model.use_fused_kernels=False", "trainer.n_gpus_per_node=2", "trainer.device=cpu",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.model.activation_offload.min_tensor_bytes=0",
            "critic.model.activation_offload.min_tensor_bytes=0"]
    return load_config(base + list(over), validate=False)


def _actor(strategy, over, role="actor"):
    from rlx.engine.actor import ActorEngine

    torch.manual_seed(0)
    cfg = _cfg(strategy, over)
    arr = cfg.actor_rollout_ref
    return ActorEngine(role=role, model_cfg=arr.model, actor_cfg=arr.actor, fsdp_cfg=arr.actor.fsdp_config,
                       strategy=strategy, device=torch.device("cpu"), world_size=2, rollout_n=2, temperature=0.7)


def _critic(strategy, over):
    from rlx.engine.critic import CriticEngine

    torch.manual_seed(0)
    cfg = _cfg(strategy, [o.replace("actor_rollout_ref.model.", "critic.model.") for o in over])
    return CriticEngine(critic_cfg=cfg.critic, device=torch.device("cpu"), world_size=2)


def _close(a, b, tol, what):
    assert a.keys() == b.keys(), what
    for k in a:
        d = (a[k] - b[k]).abs().max().item()
        scale = max(1.0, b[k].abs().max().item())
        assert d <= tol * scale, f"{what}: {k} differs by {d:.3g}"


OFFLOAD = ["actor_rollout_ref.model.enable_activation_offload=True",
           "actor_rollout_ref.model.enable_gradient_checkpointing=True"]
RMPAD = ["actor_rollout_ref.model.use_remove_padding=True"]
FUSED = ["actor_rollout_ref.model.use_fused_kernels=True", "actor_rollout_ref.model.fused_kernel_options.chunk_size=5"]


def _worker(rank, world, port, strategy):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        batch = make_batch(rows=8, seed=rank)  # each rank its own rows (and token counts)

        # -- forward outputs: remove padding and the fused head against the padded full-logits path
        ref = _actor(strategy, [], role="ref").compute_log_prob(batch, 3, with_entropy=True)
        for name, over, dyn in (("rmpad", RMPAD, None), ("rmpad+dyn", RMPAD, 30), ("fused", FUSED, None),
                                ("fused chunk>resp", FUSED[:1], None), ("fused+rmpad+dyn", FUSED + RMPAD, 30)):
            got = _actor(strategy, over, role="ref").compute_log_prob(batch, 3, with_entropy=True, max_token_len=dyn)
            _close(dict(got.tensors), dict(ref.tensors), 1e-5, f"{strategy} log-probs {name}")
        v_ref = _critic(strategy, []).compute_values(batch)["values"]
        v_got = _critic(strategy, RMPAD + ["critic.use_dynamic_bsz=True", "critic.forward_max_token_len_per_gpu=30"]
                        ).compute_values(batch)["values"]
        _close({"v": v_got}, {"v": v_ref}, 1e-5, f"{strategy} values rmpad")

        # -- update gradients: every split equals one micro-batch per mini-batch, for each loss_agg_mode
        splits = {"uneven": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
                  "dynamic": ["actor_rollout_ref.actor.use_dynamic_bsz=True",
                              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30"]}
        for mode in MODES:
            common = [f"actor_rollout_ref.actor.loss_agg_mode={mode}", "actor_rollout_ref.actor.entropy_coeff=0.01",
                      "actor_rollout_ref.actor.use_kl_loss=True"]
            one = common + ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
            e = _actor(strategy, one)
            g_one = _capture_grads(e)
            m_one = e.update_policy(batch)
            for name, over in splits.items():
                for extra, tag in (([], ""), (OFFLOAD, "+offload")):
                    e = _actor(strategy, common + over + extra)
                    g = _capture_grads(e)
                    m = e.update_policy(batch)
                    _close(g, g_one, 1e-6, f"{strategy} actor grads {mode} {name}{tag}")
                    # float32 log-probs of other micro-batch shapes: token-sum's loss is a sum over tokens (not a
                    # mean), so its rounding is relative to that sum
                    one_loss = m_one["actor/pg_loss"]
                    tol = 1e-5 * abs(one_loss) if mode == "token-sum" else 1e-6
                    assert abs(m["actor/pg_loss"] - one_loss) < tol, \
                        (mode, name, tag, m["actor/pg_loss"], one_loss)
            for name, over in (("rmpad+dynamic", RMPAD + splits["dynamic"] + OFFLOAD),
                               ("fused+rmpad+dynamic", FUSED + RMPAD + splits["dynamic"] + OFFLOAD)):
                e = _actor(strategy, common + over)
                g = _capture_grads(e)
                e.update_policy(batch)
                _close(g, g_one, 1e-5, f"{strategy} actor grads {mode} {name}")

            c_common = [f"actor_rollout_ref.actor.loss_agg_mode={mode}"]
            e = _critic(strategy, c_common + ["critic.ppo_micro_batch_size_per_gpu=8"])
            c_one = _capture_grads(e)
            e.update_critic(batch)
            for name, over, tol in (("uneven", ["critic.ppo_micro_batch_size_per_gpu=3"], 1e-6),
                                    ("dynamic+offload", ["critic.use_dynamic_bsz=True", "critic.ppo_max_token_len_per_gpu=30",
                                                         "critic.model.enable_activation_offload=True"], 1e-6),
                                    ("rmpad+dynamic", RMPAD + ["critic.use_dynamic_bsz=True",
                                                               "critic.ppo_max_token_len_per_gpu=30"], 1e-5)):
                e = _critic(strategy, c_common + over)
                g = _capture_grads(e)
                e.update_critic(batch)
                _close(g, c_one, tol, f"{strategy} critic grads {mode} {name}")
    finally:
        end_rank()


def test_packed_kernel_on_a_cpu_is_sdpa_per_sequence():
    """No varlen kernel on a CPU: the per-sequence SDPA is registered and chosen (the GPU choice is tested in
    tests/e2e/test_attention_gpu.py)."""
    from rlx.engine.attention import PACKED_SDPA, packed_attn_implementation, packed_kernel

    assert packed_kernel("cpu") == "sdpa-per-sequence"
    assert packed_attn_implementation("cpu") == PACKED_SDPA


def test_the_varlen_kernel_leaves_float32_and_dropout_to_the_per_sequence_path(monkeypatch):
    """torch's varlen kernel takes half precision and no dropout: a float32 row (or dropout) asked of it runs per
    sequence, with the same result as the per-sequence kernel."""
    import rlx.engine.attention as A

    def no_varlen(*args, **kwargs):
        raise AssertionError("the varlen kernel was called for float32")

    monkeypatch.setattr(A, "_varlen", no_varlen)
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    out = A.packed_attention(q, k, v, cu, 5, 0.0, None, "varlen")
    torch.testing.assert_close(out, A.packed_attention(q, k, v, cu, 5, 0.0, None, "sdpa-per-sequence"))
    assert out.shape == (1, 9, 4, 8)
