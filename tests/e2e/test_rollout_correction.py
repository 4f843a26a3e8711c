"""End-to-end half of tests/unit/test_rollout_correction.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested."""
from __future__ import annotations
import pytest
from conftest import fit_job


def test_grpo_with_rollout_correction_trains(ray_local, tmp_path):
    """GRPO with token IS weights and token_k1 rejection through the trainer, against the HF rollout's own
    log-probs: the rollout engine is synced from the actor, so weights are ~1 and nothing is rejected."""
    history, before, after = fit_job([
        "trainer.total_training_steps=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.val_files=synthetic://digits/size:8/seed:1",
        "trainer.val_before_train=False", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.calculate_log_probs=True", "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=2.0"],
        tmp_path)
    assert len(history) == 2 and before != after
    for m in history:
        assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
        assert m["rollout_corr/rollout_rs_masked_fraction"] == 0.0
        assert abs(m["rollout_corr/kl"]) < 1e-3 and m["actor/grad_norm"] > 0


def test_grpo_in_bypass_mode_trains(ray_local, tmp_path):
    """bypass_mode through the trainer: no old log-prob pass, the correction's metrics from the actor's loss."""
    history, before, after = fit_job([
        "trainer.total_training_steps=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.val_files=synthetic://digits/size:8/seed:1",
        "trainer.val_before_train=False", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.calculate_log_probs=True", "algorithm.rollout_correction.bypass_mode=True",
        "algorithm.rollout_correction.loss_type=reinforce", "algorithm.rollout_correction.rollout_is=token"],
        tmp_path)
    assert len(history) == 2 and before != after
    for m in history:  # weights pi / pi_rollout near 1: the engine was synced, then the first mini-batch's update
        assert "timing_s/old_log_prob" not in m  # moved the policy a little for the second
        assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.1) and m["actor/grad_norm"] > 0
