"""End-to-end half of tests/unit/test_lora.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
from conftest import spawn_per_strategy
from unit.test_lora import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    LORA_JOB,
    WORLD,
    _check,
)


def test_lora_engine_fsdp1_fsdp2(tmp_path):
    """Per strategy: a frozen base; offload + checkpointing (+ tiling) bit for bit; the adapter-off ref equals a
    separate base model; merged / adapter exports; exact resume."""
    spawn_per_strategy(_check, str(tmp_path), WORLD)


def test_grpo_lora_default_job_learns(tmp_path):
    """The default job (GRPO on the tiny task, 20 steps, 2 workers) with LoRA, through the entry point: the
    validation reward and the sampled training reward rise from the start (the sampled policy sharpens: its
    entropy falls), and the rollout (synced with merged weights) scores the responses as the actor does."""
    import json
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", *LORA_JOB,
                           "actor_rollout_ref.rollout.calculate_log_probs=True", "trainer.logger=[console,file]",
                           f"trainer.default_local_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    val = [m["val/synthetic/digits/reward/mean"] for m in lines if "val/synthetic/digits/reward/mean" in m]
    assert len(lines) == 21 and len(val) >= 2, (len(lines), val)
    assert val[-1] > val[0] + 0.2, val
    # the sampled reward too (at temperature 1 the frozen random head capped it near 0.03; see quickstart_lora.yaml)
    score = [m["critic/score/mean"] for m in lines if "critic/score/mean" in m]
    entropy = [m["actor/entropy"] for m in lines if "actor/entropy" in m]
    assert sum(score[-3:]) / 3 > score[0] + 0.2, score
    assert entropy[-1] < entropy[0] - 1.0, entropy
    diffs = [m["training/rollout_probs_diff_mean"] for m in lines if "training/rollout_probs_diff_mean" in m]
    assert len(diffs) == 20 and max(diffs) < 1e-4, diffs


def test_ppo_critic_lora_actor_fsdp1(ray_local, tmp_path):
    """PPO with a (fully trained) critic, LoRA on the actor (FSDP1), a KL loss against the adapter-off ref, the HF
    rollout: 2 steps, the policy and the critic both train."""
    from conftest import fit_job

    history, before, after = fit_job(
        ["trainer.total_training_steps=2", "data.train_batch_size=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one optimizer step per training step
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.val_files=synthetic://digits/size:8/seed:1",
         "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.rollout.name=hf",
         "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.rollout.calculate_log_probs=True"],
        tmp_path, config_name="quickstart_lora")
    assert len(history) == 2 and before != after
    for m in history:
        assert m["actor/grad_norm"] > 0 and m["critic/grad_norm"] > 0 and "critic/vf_loss" in m
        assert "actor/kl_loss" in m and m["training/rollout_probs_diff_mean"] < 1e-4
    # lora_B starts at zero: before its first optimizer step the policy is the ref, exactly
    assert history[0]["actor/kl_loss"] == 0.0
    assert history[1]["actor/kl_loss"] > 0.0
