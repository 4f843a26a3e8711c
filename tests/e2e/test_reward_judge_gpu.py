"""examples/grpo_trainer/run_grpo_genrm.sh on one GPU (vLLM 0.22 on the GPU image): GRPO on GSM8K (prepared from
$RLX_GSM8K_DIR; skipped when unset) with random weights of Qwen2.5-0.5B dims as the policy and Qwen2.5-1.5B dims as
the judge (the recipe's sizes), 3 steps. Every step's score is the judge's (reward/judge_* reported, the dumped
scores the parse of the dumped verdicts), and the per-phase timings and GPU memory after the judge's phase are
printed. Run with
    RLX_GSM8K_DIR=<dir with train.jsonl/test.jsonl> python -m pytest -m gpu tests/e2e/test_reward_judge_gpu.py -x -q -s
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from rlx.reward.judge import parse_score
from e2e.test_vllm_gpu import RECIPE_STEPS, gsm8k, random_0_5b  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")]


def test_genrm_recipe_on_one_gpu(gsm8k, random_0_5b, tmp_path):  # noqa: F811
    from rlx.models.random_weights import random_model_dir

    env = dict(os.environ, MODEL_PATH=random_0_5b, JUDGE_PATH=random_model_dir("qwen2.5-1.5b"), DATA_DIR=gsm8k, N_GPUS="1",
               PYTHON=sys.executable, VLLM_ENABLE_V1_MULTIPROCESSING="0", TENSORBOARD_DIR=str(tmp_path / "tb"))
    env.pop("RAY_ADDRESS", None)
    extra = RECIPE_STEPS + ["trainer.logger=[console,file]", f"trainer.default_local_dir={tmp_path}",
                            f"trainer.rollout_data_dir={tmp_path}/rollouts", "reward_model.rollout.response_length=64",
                            "reward_model.judge.failure_score=-1"]
    proc = subprocess.run(["bash", os.path.join(REPO, "examples/grpo_trainer/run_grpo_genrm.sh"), *extra], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=540)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    steps = [json.loads(line) for line in open(tmp_path / "logs" / "metrics.jsonl") if '"timing_s/step"' in line]
    assert len(steps) == 3, tail
    for i, m in enumerate(steps, 1):
        print(f"genrm step {i}: score {m['critic/score/mean']:.3f}, parse failures "
              f"{m['reward/judge_parse_failures']:.0f}, verdict {m['reward/judge_verdict_length/mean']:.0f} tokens | "
              f"gen {m['timing_s/gen']:.1f}s, reward (judge) {m['timing_s/reward']:.1f}s, "
              f"update_actor {m['timing_s/update_actor']:.1f}s, step {m['timing_s/step']:.1f}s | GPU in use after "
              f"the judge {m.get('perf/gpu_memory_gib/after_reward_model', float('nan')):.1f} GiB")
        rows = [json.loads(line) for line in open(tmp_path / "rollouts" / f"{i}.jsonl")]
        expected = [(-1.0 if parse_score(r["judge_verdict"], 0, 10) is None else parse_score(r["judge_verdict"], 0, 10))
                    for r in rows]
        assert [r["score"] for r in rows] == pytest.approx(expected)
        assert m["critic/score/mean"] == pytest.approx(sum(expected) / len(expected))
