"""End-to-end half of tests/unit/test_dynamic_sampling.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
from conftest import fit_job
from unit.test_dynamic_sampling import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    REWARD,
)


def test_grpo_with_dynamic_sampling_trains(ray_local, tmp_path):
    """GRPO with filter_groups: every trained group has a spread (no even-target group, whose responses all score
    1.0, reaches the update), batches of train_batch_size groups, rounds of gen_batch_size prompts."""
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    history, before, after = fit_job([
        "trainer.total_training_steps=2", "data.train_batch_size=4", "data.gen_batch_size=6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "data.val_files=synthetic://digits/size:8/seed:1", "trainer.val_before_train=False",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=4",
        "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=20", f"custom_reward_function.path={reward}"], tmp_path)
    assert len(history) == 2 and before != after
    for m in history:
        assert m["train/num_gen_batches"] >= 1 and 0 < m["train/filter_groups/kept_ratio"] <= 1
        assert m["critic/score/max"] <= 0.5  # no all-1.0 group was trained on
        assert m["critic/score/max"] == 0.5 and m["critic/score/min"] == 0.0  # every kept group has a spread
        assert m["actor/grad_norm"] > 0
        assert m["reward/timeouts"] == 0  # the custom function scored in reward_model.num_workers processes


def test_dapo_recipe_script_runs_on_cpu(tmp_path):
    """examples/dapo_trainer/run_dapo_tiny_cpu.sh through the entry point (2 steps): dynamic sampling, clip-higher,
    token-mean, the dapo manager's overlong penalty; every step logs its generation rounds."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", "examples/dapo_trainer/run_dapo_tiny_cpu.sh", "trainer.total_training_steps=2",
                           "trainer.logger=[console,file]", f"trainer.default_local_dir={tmp_path}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "train/num_gen_batches" in x]
    assert len(steps) == 2
    for m in steps:
        assert 1 <= m["train/num_gen_batches"] <= 10 and m["actor/grad_norm"] > 0
        assert m["critic/score/min"] < 0  # the overlong penalty: 16-token responses exceed 16 - 4 tokens


def test_ppo_gae_with_pf_ppo_trains(ray_local, tmp_path):
    """use_pf_ppo with GAE through the trainer: the resampled batch (same size) updates actor and critic."""
    history, before, after = fit_job([
        "trainer.total_training_steps=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.val_files=synthetic://digits/size:8/seed:1",
        "trainer.val_before_train=False", "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.name=hf",
        "algorithm.use_pf_ppo=True", "algorithm.pf_ppo.reweight_method=max_min"], tmp_path)
    assert len(history) == 2 and before != after
    for m in history:
        assert m["actor/grad_norm"] > 0 and "critic/vf_loss" in m
