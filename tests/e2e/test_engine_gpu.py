"""The FSDP engines on CUDA (no Ray): activation offload through the engine, param/optimizer CPU offload.

Runs in one process (world size 1, NCCL). Checks that an update with activation offload (+ checkpointing) gives
the same weights as the same update without it, and that parameter/optimizer offload round-trips.
"""
import pytest
import torch

from conftest import one_rank_group

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def dist():
    with one_rank_group("cuda") as device:
        yield device


def _engine(strategy, offload: bool, param_offload: bool = False):
    from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig, OptimConfig
    from rlx.offload import ActivationOffloadConfig
    from rlx.engine.actor import ActorEngine

    torch.manual_seed(0)
    model_cfg = ModelConfig(path="builtin://tiny-qwen2", use_remove_padding=False,
                            enable_gradient_checkpointing=True, enable_activation_offload=offload,
                            activation_offload=ActivationOffloadConfig(min_tensor_bytes=0, keep_last_layers=0))
    fsdp_cfg = FSDPConfig(param_offload=param_offload, optimizer_offload=param_offload)
    actor_cfg = ActorConfig(strategy=strategy, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2,
                            optim=OptimConfig(lr=1e-3), fsdp_config=fsdp_cfg)
    return ActorEngine(role="actor", model_cfg=model_cfg, actor_cfg=actor_cfg, fsdp_cfg=fsdp_cfg, strategy=strategy,
                       device=torch.device("cuda"), world_size=1, rollout_n=1, temperature=1.0, total_steps=4)


def _batch(step):
    from rlx.protocol import Batch

    g = torch.Generator().manual_seed(step)
    prompt, resp = 8, 24
    ids = torch.randint(3, 259, (4, prompt + resp), generator=g)
    mask = torch.ones_like(ids)
    mask[2:, :3] = 0  # left padding on half the rows
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                  "responses": ids[:, prompt:], "response_mask": torch.ones(4, resp),
                  "advantages": torch.randn(4, resp, generator=g)})


def _train(engine, steps=2):
    for step in range(steps):
        b = _batch(step)
        lp = engine.compute_log_prob(b, 2)["log_probs"]
        metrics = engine.update_policy(b.union(type(b)({"old_log_probs": lp})))
        assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    return engine.compute_log_prob(_batch(99), 4)["log_probs"], metrics


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_engine_offload_matches_plain_update(dist, strategy):
    plain, _ = _train(_engine(strategy, offload=False))
    offl, metrics = _train(_engine(strategy, offload=True))
    assert metrics["perf/update_actor/offloaded_activation_gb"] > 0
    torch.testing.assert_close(offl, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_param_and_optimizer_offload_round_trip(dist, strategy):
    plain, _ = _train(_engine(strategy, offload=False))
    engine = _engine(strategy, offload=True, param_offload=True)
    offl, _ = _train(engine)
    assert all(p.device.type == "cpu" for p in engine.module.parameters()), "params not offloaded between phases"
    torch.testing.assert_close(offl, plain, rtol=0, atol=1e-5)
