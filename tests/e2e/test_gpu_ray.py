"""The GPU job through Ray as verl users run it: default device (auto -> cuda, bf16 mixed precision), colocated
roles on the placement group's bundles, activation offload (+ gradient checkpointing) on the trained models, HF
rollout. GRPO on FSDP2 and PPO with a critic on FSDP1, 2 steps each, on one GPU; PPO with a critic on two GPUs when
the machine has them (the layout that once put two actor ranks on one GPU)."""
import pytest
import torch

from rlx.plan import make_plan
from rlx.trainer.ppo_trainer import RayPPOTrainer

from conftest import load_config  # the quickstart job's config

pytestmark = pytest.mark.gpu

TINY = ["trainer.total_training_steps=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.val_files=synthetic://digits/size:8/seed:1",
        "trainer.logger=[console]", "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.enable_activation_offload=True",
        "actor_rollout_ref.model.activation_offload.min_tensor_bytes=0",
        "actor_rollout_ref.model.activation_offload.keep_last_layers=0"]
CRITIC_OFFLOAD = ["critic.model.enable_gradient_checkpointing=True", "critic.model.enable_activation_offload=True",
                  "critic.model.activation_offload.min_tensor_bytes=0",
                  "critic.model.activation_offload.keep_last_layers=0"]


def _train(overrides, tmp_path):
    cfg = load_config(TINY + overrides + [f"trainer.default_local_dir={tmp_path}"])
    assert cfg.trainer.device == "cuda"  # the default, auto, found the GPU
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision["param_dtype"] == "bf16"
    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    trainer.init_workers()
    try:
        before = trainer.param_checksum()
        history = trainer.fit()
        after = trainer.param_checksum()
    finally:
        trainer.shutdown()
    return history, before, after


def _check(history, before, after, critic: bool):
    assert len(history) == 2
    for step, m in enumerate(history, 1):
        print(f"step {step}: " + " ".join(f"{k}={m[k]:.4g}" for k in sorted(m) if k in SHOWN or
                                         k.endswith("offloaded_activation_gb")), flush=True)
        assert m["actor/grad_norm"] > 0 and torch.isfinite(torch.tensor(m["actor/pg_loss"]))
        assert m["perf/update_actor/offloaded_activation_gb"] > 0
        assert m["perf/max_memory_allocated_gb"] > 0
        if critic:
            assert "critic/vf_loss" in m and m["critic/grad_norm"] > 0
            assert m["perf/update_critic/offloaded_activation_gb"] > 0
    assert before != after, "the actor's weights did not change"


SHOWN = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm",
         "perf/max_memory_allocated_gb", "timing_s/step")


def test_grpo_fsdp2_offload_one_gpu(ray_local, tmp_path):
    history, before, after = _train(["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.strategy=fsdp2",
                                     "actor_rollout_ref.actor.use_kl_loss=True",
                                     "actor_rollout_ref.actor.fsdp_config.param_offload=True",
                                     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True"], tmp_path)
    _check(history, before, after, critic=False)


def test_ppo_critic_fsdp_offload_one_gpu(ray_local, tmp_path):
    history, before, after = _train(["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.strategy=fsdp",
                                     "critic.strategy=fsdp", *CRITIC_OFFLOAD], tmp_path)
    _check(history, before, after, critic=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ppo_critic_two_gpus(ray_local, tmp_path):
    history, before, after = _train(["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.strategy=fsdp2",
                                     "trainer.n_gpus_per_node=2", *CRITIC_OFFLOAD], tmp_path)
    _check(history, before, after, critic=True)
