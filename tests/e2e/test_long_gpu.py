"""GPU checks of the long-response path (marked `gpu`, skipped without CUDA): the fused head's gradients are at the
bf16 noise floor, and the engine's packed / fused / tiled / offloaded paths give what the padded full-logits path
gives, on CUDA (real streams, SDPA's CUDA kernels)."""
from __future__ import annotations

import pytest
import torch

from rlx.ops.log_prob_head import log_probs_from_hidden

from conftest import one_rank_group

pytestmark = pytest.mark.gpu


def _grads(h, w, y, chunk, dtype):
    h = h.to(dtype).detach().requires_grad_()
    w = w.to(dtype).detach().requires_grad_()
    lp, ent = log_probs_from_hidden(h, w, None, y, 0.8, chunk_size=chunk, with_entropy=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    (lp * torch.randn(lp.shape, device="cuda", generator=g)).sum().add(0.01 * ent.sum()).backward()
    return lp.double(), h.grad.double(), w.grad.double()


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_fused_head_gradients_at_the_bf16_noise_floor():
    torch.manual_seed(0)
    n, hid, vocab = 3000, 512, 32000
    h, w = torch.randn(n, hid, device="cuda"), 0.05 * torch.randn(vocab, hid, device="cuda")
    y = torch.randint(0, vocab, (n,), device="cuda")
    ref = _grads(h, w, y, None, torch.float64)  # exact reference
    full = _grads(h, w, y, None, torch.bfloat16)  # what the full-logits path gives in bf16
    fused = _grads(h, w, y, 1024, torch.bfloat16)
    for name, r, f, c in zip(("log_probs", "grad_hidden", "grad_weight"), ref, full, fused):
        noise, err = _rel(f, r), _rel(c, r)
        print(f"{name}: full-bf16 rel err {noise:.3g}, fused-bf16 rel err {err:.3g}")
        assert err <= 1.5 * noise + 1e-6, (name, err, noise)


def _engine_logprobs_and_grads(over):
    from conftest import load_config  # the quickstart config
    from rlx.engine.actor import ActorEngine

    torch.manual_seed(0)
    cfg = load_config(["trainer.device=cuda", "trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                       "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                       "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
                       "actor_rollout_ref.model.activation_offload.min_tensor_bytes=0"] + over, validate=False)
    arr = cfg.actor_rollout_ref
    e = ActorEngine(role="actor", model_cfg=arr.model, actor_cfg=arr.actor, fsdp_cfg=arr.actor.fsdp_config,
                    strategy=arr.actor.strategy, device=torch.device("cuda", 0), world_size=1, rollout_n=2,
                    temperature=0.7)
    from unit.test_batch_shaping import _capture_grads, make_batch

    batch = make_batch(rows=8, prompt=24, resp=40)
    lp = e.compute_log_prob(batch, 3, with_entropy=True)
    grads = _capture_grads(e)
    e.update_policy(batch)
    return lp, grads


@pytest.fixture(scope="module")
def nccl_group():
    with one_rank_group("cuda"):
        yield


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_engine_long_path_matches_padded_full_logits_on_cuda(nccl_group, strategy):
    base = [f"actor_rollout_ref.actor.strategy={strategy}"]
    ref_lp, ref_g = _engine_logprobs_and_grads(base + ["actor_rollout_ref.model.use_fused_kernels=False",
                                                       "actor_rollout_ref.model.enable_gradient_checkpointing=False"])
    got_lp, got_g = _engine_logprobs_and_grads(base + [
        "actor_rollout_ref.model.use_fused_kernels=True", "actor_rollout_ref.model.fused_kernel_options.chunk_size=64",
        "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.model.tile_mlp_tokens=32",
        "actor_rollout_ref.model.enable_activation_offload=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=200"])
    for k in ("log_probs", "entropys"):
        d = (got_lp[k] - ref_lp[k]).abs().max().item()
        assert d < 1e-4, (k, d)
    worst = max(_rel(got_g[k].double(), ref_g[k].double()) for k in ref_g)
    print(f"{strategy}: worst relative gradient difference {worst:.3g}")
    assert worst < 1e-4, worst
