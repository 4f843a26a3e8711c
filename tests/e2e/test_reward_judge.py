"""End-to-end half of tests/unit/test_reward_judge.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import json
import os
import subprocess
import sys
import numpy as np
import pytest
from rlx.reward.judge import parse_score
from conftest import REPO
from unit.test_reward_judge import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    JUDGE,
)


# ---------------------------------------------------------------------------------------------- GRPO
@pytest.mark.slow
def test_grpo_scored_by_a_judge_through_the_entry_point(tmp_path):
    """GRPO on the quickstart job (2 CPU workers per role) with the tiny model as its own judge, through `python -m
    rlx.trainer.main_ppo`: every response's score, in training and in validation, is the one parsed from the
    judge's verdict (written next to it in trainer.rollout_data_dir / validation_data_dir), failures scored -3;
    critic/score/*, val/*/reward/mean and reward/judge_* are the judge's. (With these seeds the random judge's
    verdicts parse for a few validation samples, so both paths run.)"""
    rollouts, val = tmp_path / "rollouts", tmp_path / "val"
    args = ["--config-name", "quickstart", "trainer.device=cpu", "trainer.total_training_steps=1",
            "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.name=hf", "data.val_files=synthetic://digits/size:64/seed:1",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.logger=[file]",
            f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.save_freq=-1",
            f"trainer.rollout_data_dir={rollouts}", f"trainer.validation_data_dir={val}", *JUDGE,
            "reward_model.rollout.prompt_length=96", "reward_model.rollout.response_length=24",
            "reward_model.judge.failure_score=-3",
            "reward_model.judge.prompt_template='{question}{response} Rate 0-9. Score:'"]
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (log,) = list((tmp_path / "ckpt").rglob("metrics.jsonl"))
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    train = next(s for s in steps if "critic/score/mean" in s)
    valid = next(s for s in steps if "val/synthetic/digits/reward/mean" in s)

    def judged(path):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        expected = []
        for row in rows:
            parsed = parse_score(row["judge_verdict"], 0.0, 10.0)
            expected.append(-3.0 if parsed is None else parsed)
            assert row["score"] == pytest.approx(expected[-1])
        return expected

    expected = judged(rollouts / "1.jsonl")
    assert len(expected) == 4
    assert train["critic/score/mean"] == pytest.approx(np.mean(expected))
    assert train["critic/score/max"] == pytest.approx(max(expected))
    assert train["reward/judge_parse_failures"] == sum(e == -3.0 for e in expected)
    assert "actor/pg_loss" in train and "reward/judge_verdict_length/mean" in train
    val_expected = judged(next(val.glob("*.jsonl")))
    assert len(val_expected) == 64
    assert valid["val/synthetic/digits/reward/mean"] == pytest.approx(np.mean(val_expected))
    assert any(e != -3.0 for e in val_expected), "no verdict parsed: the job no longer reaches the parsed-score path " \
        "(a property of the seeds and the template above: pick a template that gives some digits again)"
