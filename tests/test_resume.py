"""Checkpoint/resume through the entry point: a resumed run's next step equals the uninterrupted run's."""
import os
import shutil

import pytest

from test_e2e import SMALL
from rlx.config import load_config
from rlx.trainer.ppo_trainer import RayPPOTrainer


def run(overrides):
    cfg = load_config(SMALL + overrides)
    trainer = RayPPOTrainer(cfg, "hf")
    try:
        return trainer.fit()
    finally:
        trainer.actor_wg.shutdown()
        if trainer.critic_wg is not None:
            trainer.critic_wg.shutdown()


@pytest.mark.parametrize("strategy,estimator", [("fsdp", "gae"), ("fsdp2", "grpo")])
def test_resume_reproduces_the_next_step(ray_local, tmp_path, strategy, estimator):
    common = [f"actor_rollout_ref.actor.strategy={strategy}", f"algorithm.adv_estimator={estimator}",
              "trainer.total_training_steps=3", "trainer.save_freq=2", "trainer.test_freq=-1",
              "trainer.val_before_train=False", "trainer.max_actor_ckpt_to_keep=2"]
    full = run(common + [f"trainer.default_local_dir={tmp_path}"])
    assert len(full) == 3
    for step in (2, 3):
        assert os.path.exists(tmp_path / f"global_step_{step}" / "COMPLETE")
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    export = tmp_path / "global_step_3" / "actor" / "huggingface"
    assert (export / "config.json").exists()

    # A crash during the step-3 save: its parts exist but it never became complete. auto-resume must take
    # step 2, the newest complete checkpoint, and train step 3 again — identically.
    os.remove(tmp_path / "global_step_3" / "COMPLETE")
    resumed = run(common + [f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto"])
    assert len(resumed) == 1, "the resumed run must start at step 3"
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
        assert resumed[0][key] == pytest.approx(full[2][key], abs=1e-6), key
    if estimator == "gae":
        assert resumed[0]["critic/vf_loss"] == pytest.approx(full[2]["critic/vf_loss"], abs=1e-6)
    shutil.rmtree(tmp_path, ignore_errors=True)
