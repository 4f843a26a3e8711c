"""fsdp_config.optimizer_offload within an update: the optimizer state comes to the device at the first optimizer
step (after the first mini-batch's forward and backward), not before the first forward, and goes back once at the
end. (On CUDA the moves are real and the update equals the one without offload: tests/e2e/test_engine_gpu.py.)"""
import torch

from conftest import one_rank_group


def test_optimizer_state_comes_at_the_first_step_and_leaves_at_the_end(monkeypatch):
    from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig, OptimConfig
    from rlx.engine import fsdp
    from rlx.engine.actor import ActorEngine
    from e2e.test_engine_gpu import _batch

    events = []
    with one_rank_group("cpu") as device:
        fsdp_cfg = FSDPConfig(optimizer_offload=True)
        model_cfg = ModelConfig(path="builtin://tiny-qwen2", use_remove_padding=False)
        actor_cfg = ActorConfig(strategy="fsdp2", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1,
                                optim=OptimConfig(lr=1e-3), fsdp_config=fsdp_cfg)
        engine = ActorEngine(role="actor", model_cfg=model_cfg, actor_cfg=actor_cfg, fsdp_cfg=fsdp_cfg,
                             strategy="fsdp2", device=device, world_size=1, rollout_n=1, temperature=1.0,
                             total_steps=2)
        monkeypatch.setattr(fsdp, "move_optimizer_state", lambda opt, dev: events.append(f"state to {dev.type}"))
        step, context = engine.optimizer_step, engine.micro_batch_context
        monkeypatch.setattr(engine, "optimizer_step", lambda clip: events.append("step") or step(clip))
        monkeypatch.setattr(engine, "micro_batch_context", lambda: events.append("micro-batch") or context())
        batch = _batch(0)  # 4 rows: 2 mini-batches of 2 rows, 2 micro-batches each
        engine.update_policy(batch.union(type(batch)({"old_log_probs": torch.zeros(4, 24)})))
    assert events == ["micro-batch", "micro-batch", "state to cpu", "step", "micro-batch", "micro-batch", "step",
                      "state to cpu"], events
