"""Checkpoint/resume through the entry point: a resumed run's next step equals the uninterrupted run's."""
import os
import shutil

import pytest

from e2e.test_e2e import SMALL
from rlx.plan import make_plan
from rlx.trainer.ppo_trainer import RayPPOTrainer

from conftest import load_config  # the quickstart job's config


def run(overrides):
    cfg = load_config(SMALL + overrides + ["actor_rollout_ref.rollout.name=hf"])
    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    try:
        return trainer.fit()
    finally:
        trainer.shutdown()


def _overwrite_a_model_shard(step_dir) -> str:
    """Same size, different bytes: what a disk error or a stray writer leaves; only the checksum can tell."""
    shard = sorted((step_dir / "actor" / "model").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = b"\x7f" * 64
    shard.write_bytes(bytes(data))
    return str(shard.relative_to(step_dir))


@pytest.mark.parametrize("strategy,estimator,damage", [("fsdp", "gae", "crashed_save"),
                                                       ("fsdp2", "grpo", "overwritten_shard")])
def test_resume_reproduces_the_next_step(ray_local, tmp_path, caplog, strategy, estimator, damage):
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
    # each role's meta.json records its model as the preflight builds it on the meta device (compared at resume)
    import json

    from rlx.engine.architecture import expected

    cfg = load_config(SMALL + common)
    for role, model_cfg in (("actor", cfg.actor_rollout_ref.model), ("critic", cfg.critic.model)):
        if (tmp_path / "global_step_3" / role).exists():
            record = json.loads((tmp_path / "global_step_3" / role / "meta.json").read_text())["model"]
            assert record == expected(model_cfg, role), role

    # A crash during the step-3 save (its parts exist but it never became complete), or a step-3 shard whose
    # bytes were overwritten after the save: auto-resume must take step 2, the newest complete checkpoint that
    # verifies, and train step 3 again — identically.
    if damage == "crashed_save":
        os.remove(tmp_path / "global_step_3" / "COMPLETE")
    else:
        shard = _overwrite_a_model_shard(tmp_path / "global_step_3")
    with caplog.at_level("WARNING", logger="rlx"):
        resumed = run(common + [f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto"])
    if damage == "overwritten_shard":
        assert f"{tmp_path / 'global_step_3'} is damaged" in caplog.text and shard in caplog.text
        assert f"resuming from the previous complete checkpoint {tmp_path / 'global_step_2'}" in caplog.text
    assert len(resumed) == 1, "the resumed run must start at step 3"
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
        assert resumed[0][key] == pytest.approx(full[2][key], abs=1e-6), key
    if estimator == "gae":
        assert resumed[0]["critic/vf_loss"] == pytest.approx(full[2]["critic/vf_loss"], abs=1e-6)
    shutil.rmtree(tmp_path, ignore_errors=True)
