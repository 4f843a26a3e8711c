"""Liger kernels (`model.use_liger`) in the engines on one GPU (NCCL, world size 1): `pytest -m gpu
tests/e2e/test_liger_gpu.py`.

With Liger's RMSNorm, SwiGLU MLP and RoPE in the actor and the critic, fp32: the gradients of an update with
activation offload + checkpointing (and with the tiled decoder layers + fused head on top) equal those of the same
update without offload bit for bit (the kernels are deterministic; offload moves saved tensors, never changes
them); and Liger's gradients agree with torch's kernels' within 1e-4 relative.
"""
import pytest
import torch

from conftest import one_rank_group

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("liger_kernel")

LIGER = ["actor_rollout_ref.model.use_liger=True", "critic.model.use_liger=True"]
OFFLOAD = ["actor_rollout_ref.model.enable_activation_offload=True",
           "actor_rollout_ref.model.enable_gradient_checkpointing=True"]
LAYER = OFFLOAD + ["actor_rollout_ref.model.tile_layer_tokens=16", "actor_rollout_ref.model.use_fused_kernels=True",
                   "actor_rollout_ref.model.fused_kernel_options.chunk_size=24"]


@pytest.fixture(scope="module", autouse=True)
def torch_rotary_after():
    """Liger's rotary replaces the model family's function for the whole process (rlx.engine.liger); the tests that
    run after this module in the same process get torch's back."""
    yield
    from transformers.models.qwen2 import modeling_qwen2

    if hasattr(modeling_qwen2, "_rlx_torch_rotary"):
        modeling_qwen2.apply_rotary_pos_emb = modeling_qwen2._rlx_torch_rotary


@pytest.fixture(scope="module")
def dist():
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with one_rank_group("cuda") as device:
            yield device
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _grads(strategy, over):
    """Gradients of one actor and one critic update (world size 1) with the config overrides `over`."""
    from rlx.engine.actor import ActorEngine
    from rlx.engine.critic import CriticEngine
    from unit.test_batch_shaping import _capture_grads, _cfg, make_batch

    common = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_mini_batch_size=4",
              "critic.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.model.enable_gradient_checkpointing=True"]
    over = common + list(over)
    dev = torch.device("cuda")
    cfg = _cfg(strategy, over)
    arr = cfg.actor_rollout_ref
    torch.manual_seed(0)
    actor = ActorEngine(role="actor", model_cfg=arr.model, actor_cfg=arr.actor, fsdp_cfg=arr.actor.fsdp_config,
                        strategy=strategy, device=dev, world_size=1, rollout_n=2, temperature=0.7)
    cfg = _cfg(strategy, [o.replace("actor_rollout_ref.model.", "critic.model.") for o in over if "fused" not in o])
    torch.manual_seed(0)
    critic = CriticEngine(critic_cfg=cfg.critic, device=dev, world_size=1)
    assert actor.liger == critic.liger == ("actor_rollout_ref.model.use_liger=True" in over)
    batch = make_batch(rows=8, prompt=12, resp=40)
    ga, gc = _capture_grads(actor), _capture_grads(critic)
    actor.update_policy(batch)
    critic.update_critic(batch)
    assert ga and gc
    return {**{f"actor.{k}": v for k, v in ga.items()}, **{f"critic.{k}": v for k, v in gc.items()}}


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_liger_offload_gradients_equal_no_offload(dist, strategy):
    plain = _grads(strategy, LIGER)
    for name, over in (("offload+ckpt", OFFLOAD), ("offload+ckpt+layer+fused", LAYER)):
        got = _grads(strategy, LIGER + over)
        assert got.keys() == plain.keys()
        if "fused" in name:  # the fused head sums its chunks in another order than the full logits
            for k, v in got.items():
                torch.testing.assert_close(v, plain[k], rtol=1e-4, atol=1e-6, msg=f"{name}: {k}")
        else:
            bad = [k for k, v in got.items() if not torch.equal(v, plain[k])]
            assert bad == [], f"{name}: gradients differ from the update without offload: {bad}"


def test_liger_matches_torch_kernels(dist):
    """Relative to each gradient's size, or to a thousandth of the largest one (a gradient that is ~0 in exact
    arithmetic, such as the k_proj bias's, is rounding noise in both)."""
    torch_grads, liger_grads = _grads("fsdp2", []), _grads("fsdp2", LIGER)
    scale = max(v.abs().max().item() for v in torch_grads.values())
    for k, v in torch_grads.items():
        rel = (liger_grads[k] - v).abs().max().item() / max(v.abs().max().item(), 1e-3 * scale)
        assert rel < 1e-4, (k, rel)
