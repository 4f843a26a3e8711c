#!/usr/bin/env python
"""Rollout overlapped with training on separate GPUs against the colocated sync run, on the same GPUs: one job, run
in each mode in sequence, then one table.

    python benchmarks/bench_async.py --job longtail --modes sync,off1        # 2 GPUs (nvidia-h100-x2): ~8 min
    python benchmarks/bench_async.py --job smollm2 --data-dir DIR --steps 20 # the real model's reward curves
    python benchmarks/bench_async.py --smoke                                 # CPU check of this script (tiny model)

Modes (--modes, comma-separated, run in this order):
  sync    colocated (verl's hybrid engine): both GPUs generate, then both train (trainer.n_gpus_per_node=2)
  on0     rollout on GPU 1, trainer on GPU 0, staleness 0 (they take turns: the colocated run's math)
  off1    the same pools, staleness 1: verl's one-step-off (batch k+1 generated while batch k trains)
  async1  the same pools, staleness 1 with partial rollout (--segment engine steps per rollout call: a sync waits
          for the segment in flight): every admitted batch starts at once and the rollout advances them together,
          so the next batch fills the engine during a batch's long tail
  async2  the same, staleness 2
  async1e2  async1 with two engines on the rollout GPU (rollout.engines_per_gpu=2, each with at most 0.45 of its
          memory): two engine loops, each carrying half of the requests

Jobs (--job):
  longtail  GRPO with a KL loss on Qwen2.5-0.5B dims with random bf16 weights whose head ends responses at widely
            spread lengths (rlx.models.random_weights, qwen2.5-0.5b-longtail: about 10% run to the 4096 cap), 32
            prompts x n=8 per step, FSDP2, gradient checkpointing, remove padding, dynamic batch size. Random
            weights do not learn: this job measures speed.
  smollm2   GRPO on GSM8K with SmolLM2-135M-Instruct (builtin://smollm2-135m-instruct; --data-dir holds
            train/test.parquet made by scripts/prepare_gsm8k.py --prompt-style short), the settings of
            examples/grpo_trainer/run_grpo_smollm2_gsm8k.sh: its reward curve is the check that overlapping
            does not hurt learning.

Printed: each mode's per-step score, then a table: seconds per step (mean over the steps after the first), tokens per
second (prompt + response tokens of the step / its seconds), the speed-up over sync (in seconds per step, and in
tokens per second: sampled response lengths differ between runs), generation and training seconds
(generation overlaps training in the async modes), each pool's idle share, the weight sync, the staleness, the
response lengths, and the score. Each mode's metrics stay in <out>/<mode>/logs/metrics.jsonl
(`python scripts/plot_metrics.py <out>/*/logs/metrics.jsonl` draws them).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("RAY_LOG_TO_DRIVER", "0")

MODES = {
    "sync": [],
    "on0": ["actor_rollout_ref.hybrid_engine=False", "async_training.staleness_threshold=0"],
    "off1": ["actor_rollout_ref.hybrid_engine=False", "async_training.staleness_threshold=1"],
    "async1": ["actor_rollout_ref.hybrid_engine=False", "async_training.staleness_threshold=1",
               "async_training.partial_rollout=True"],
    "async2": ["actor_rollout_ref.hybrid_engine=False", "async_training.staleness_threshold=2",
               "async_training.partial_rollout=True"],
    "async1e2": ["actor_rollout_ref.hybrid_engine=False", "async_training.staleness_threshold=1",
                 "async_training.partial_rollout=True", "rollout.engines_per_gpu=2"],
}


def pools(mode: str, gpus: int) -> list[str]:
    """sync: every GPU in the one colocated pool; the others: 1 GPU (CPU slot) for the rollout, the rest train."""
    if mode == "sync":
        return [f"trainer.n_gpus_per_node={gpus}"]
    return [f"trainer.n_gpus_per_node={gpus - 1}", "rollout.n_gpus_per_node=1"]


def longtail_job(a, model: str) -> list[str]:
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files=synthetic://digits/size:{a.prompts * (a.steps + 4)}/seed:0",
        "data.val_files=synthetic://digits/size:8/seed:1",
        f"data.train_batch_size={a.prompts}", "data.max_prompt_length=32", f"data.max_response_length={a.response}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=65536",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=65536",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={a.prompts // 2}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        f"actor_rollout_ref.rollout.n={a.n}", "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={a.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.enforce_eager={a.smoke}",
        "trainer.test_freq=-1", "trainer.val_before_train=False",
    ]


def smollm2_job(a, out: str) -> list[str]:
    import pandas as pd

    data = a.data_dir
    val = os.path.join(out, f"test_{a.val_prompts}.parquet")  # the first --val-prompts of the test set
    os.makedirs(out, exist_ok=True)
    pd.read_parquet(f"{data}/test.parquet").head(a.val_prompts).to_parquet(val)
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data}/train.parquet", f"data.val_files={val}",
        f"data.train_batch_size={a.prompts}", "data.max_prompt_length=256", f"data.max_response_length={a.response}",
        "data.filter_overlong_prompts=True", "data.truncation=error",
        "actor_rollout_ref.model.path=builtin://smollm2-135m-instruct",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.optim.lr=3e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={a.prompts // 2}",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=65536",
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
        f"actor_rollout_ref.rollout.n={a.n}", "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={a.gpu_memory_utilization}",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
        "reward_model.score_kwargs.format_score=0.1",
        f"trainer.test_freq={a.test_freq}", "trainer.val_before_train=True",
    ]


def run_job(overrides: list[str]) -> tuple[list[dict], float]:
    from rlx.config import load_config
    from rlx.plan import make_plan
    from rlx.trainer.launch import run

    start = time.perf_counter()
    cfg = load_config(overrides, config_name="quickstart")
    trainer = run(cfg, make_plan(cfg))
    return trainer.history, time.perf_counter() - start


def mean_after_first(history: list[dict], key: str):
    vals = [m[key] for m in (history[1:] if len(history) > 1 else history) if key in m]
    return sum(vals) / len(vals) if vals else None


def row(mode: str, history: list[dict], base: dict | None) -> dict:
    step = mean_after_first(history, "timing_s/step")
    tokens = mean_after_first(history, "perf/total_num_tokens")
    train = sum(mean_after_first(history, f"timing_s/{k}") or 0.0 for k in ("old_log_prob", "ref", "update_actor"))
    worker = sum(mean_after_first(history, f"timing_s/worker/{k}") or 0.0 for k in ("old_log_prob", "update_actor"))
    scores = [m["critic/score/mean"] for m in history]
    tail = scores[-5:]
    r = {"mode": mode, "s/step": step, "tokens/s": tokens / step if step and tokens else None,
         "gen s": mean_after_first(history, "timing_s/gen"), "train s": train, "worker lp+upd s": worker,
         "trainer idle": mean_after_first(history, "async/trainer_idle_ratio"),
         "rollout idle": mean_after_first(history, "async/rollout_idle_ratio"),
         "sync s": mean_after_first(history, "timing_s/sync_weights") or mean_after_first(history,
                                                                                        "timing_s/rollout/sync"),
         "wait sync s": mean_after_first(history, "timing_s/wait_sync"),
         "staleness": mean_after_first(history, "async/staleness_mean"),
         # the rollout engine's own work (partial rollout on vLLM): its cost per step, the requests it carries, and
         # the share of the wall time the rollout worker spends in its engine loop
         "eng ms/step": mean_after_first(history, "rollout/ms_per_engine_step"),
         "reqs/step": mean_after_first(history, "rollout/requests_per_engine_step"),
         "in engine": _ratio(mean_after_first(history, "timing_s/rollout/advance"),
                             mean_after_first(history, "timing_s/rollout/since_last")),
         "resp len mean": mean_after_first(history, "response_length/mean"),
         "resp len max": max(m["response_length/max"] for m in history),
         "score first": scores[0], "score last 5": sum(tail) / len(tail),
         "score last 5 sd": statistics.pstdev(tail) if len(tail) > 1 else 0.0}
    r["speed-up"] = (base["s/step"] / step) if base and step else None
    r["tok/s x"] = (r["tokens/s"] / base["tokens/s"]) if base and r["tokens/s"] and base["tokens/s"] else None
    return r


COLUMNS = ["mode", "s/step", "tokens/s", "speed-up", "tok/s x", "gen s", "train s", "worker lp+upd s", "trainer idle",
           "rollout idle", "sync s", "wait sync s", "staleness", "eng ms/step", "reqs/step", "in engine",
           "resp len mean", "resp len max", "score first", "score last 5", "score last 5 sd"]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(rows: list[dict]) -> str:
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, str):
            return v
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3f}" if abs(v) < 1 else f"{v:.2f}"

    cells = [COLUMNS] + [[cell(r.get(c)) for c in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(cells[0], widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |" for r in cells[1:]]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", choices=("longtail", "smollm2"), default="longtail")
    p.add_argument("--modes", default="sync,off1")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--response", type=int, default=4096)
    p.add_argument("--segment", type=int, default=None,
                   help="async modes: engine steps per rollout call (async_training.partial_rollout_segment); "
                        "default max(32, --response / 32): 128 for 4,096 tokens")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--test-freq", type=int, default=5)
    p.add_argument("--val-prompts", type=int, default=256, help="smollm2: validate on the test set's first ones")
    p.add_argument("--data-dir", default=None, help="smollm2: the folder of GSM8K's train/test.parquet")
    p.add_argument("--model-dir", default=None, help="longtail: an HF directory instead of the random long-tail one")
    p.add_argument("--out", default=None)
    p.add_argument("--set", nargs="*", default=[], help="more key=value overrides for every mode")
    p.add_argument("--table", action="store_true", help="run nothing: the table of the modes already in --out")
    p.add_argument("--smoke", action="store_true", help="CPU check: the built-in tiny model, 2 CPU workers, 3 steps")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    if a.smoke:
        a.model_dir, a.prompts, a.n, a.response, a.steps = "builtin://tiny-qwen2", 4, 2, 16, 3
    elif not a.table and (not torch.cuda.is_available() or torch.cuda.device_count() < a.gpus):
        print(f"bench_async: needs {a.gpus} CUDA GPUs (--smoke checks the script on CPU)", file=sys.stderr)
        return 2
    if a.job == "smollm2" and not a.data_dir and not a.table:
        print("bench_async: --job smollm2 needs --data-dir (scripts/prepare_gsm8k.py --prompt-style short)",
              file=sys.stderr)
        return 2
    out = a.out or tempfile.mkdtemp(prefix="rlx-bench-async-")
    if a.table:
        job = []
    elif a.job == "longtail":
        from rlx.models.random_weights import random_model_dir

        job = longtail_job(a, a.model_dir or random_model_dir("qwen2.5-0.5b-longtail"))
    else:
        job = smollm2_job(a, out)
    device = ("CPU (smoke)" if a.smoke or not torch.cuda.is_available() else
              f"{a.gpus} x {torch.cuda.get_device_name(0)}")
    print(f"bench_async: {device}, job {a.job}, {a.prompts} prompts x n={a.n}, responses up to {a.response} tokens, "
          f"{a.steps} steps per mode; out {out}", flush=True)
    run_desc = {"device": device, "prompts": a.prompts, "n": a.n, "response": a.response, "steps": a.steps}
    histories, walls, runs = {}, {}, {}
    for mode in ([] if a.table else a.modes.split(",")):
        print(f"\n=== {mode} ===", flush=True)
        segment = [f"async_training.partial_rollout_segment={a.segment or max(32, a.response // 32)}"
                   ] if "async" in mode else []
        # several engines per rollout GPU (rollout.engines_per_gpu=k): each gets at most 0.9 / k of its memory
        k = next((int(key.split("=")[1]) for key in MODES[mode] if key.startswith("rollout.engines_per_gpu=")), 1)
        share = [f"actor_rollout_ref.rollout.gpu_memory_utilization={min(a.gpu_memory_utilization, 0.9 / k):.2f}"
                 ] if k > 1 else []
        keys = job + MODES[mode] + segment + share + pools(mode, a.gpus) + [
            f"trainer.device={'cpu' if a.smoke else 'cuda'}", "trainer.nnodes=1",
            f"trainer.total_training_steps={a.steps}", "trainer.save_freq=-1", "trainer.logger=[console,file]",
            f"trainer.default_local_dir={os.path.join(out, mode)}"]
        if a.smoke:
            keys += ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.model.use_remove_padding=False",
                     "actor_rollout_ref.model.path=builtin://tiny-qwen2",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
        keys += a.set  # --set wins (also over --smoke's)
        try:
            histories[mode], walls[mode] = run_job(keys)
        except Exception as e:  # noqa: BLE001 -- the other modes still run; the table says which failed
            logging.exception("mode %s failed", mode)
            print(f"{mode}: FAILED: {type(e).__name__}: {e}", flush=True)
            continue
        with open(os.path.join(out, mode, "history.json"), "w") as f:
            json.dump({"history": histories[mode], "wall_s": walls[mode], "run": run_desc}, f)
        print(f"{mode}: score per step " + " ".join(f"{m['critic/score/mean']:.3f}" for m in histories[mode]),
              flush=True)
        vals = [f"{m['val/' + k]:.3f}@{i}" for i, m in enumerate(histories[mode], start=1) for k in
                [k[4:] for k in m if k.startswith("val/") and k.endswith("/reward/mean")]]
        if vals:
            print(f"{mode}: validation " + " ".join(vals), flush=True)
    for mode in MODES:  # earlier runs into the same --out (another call) join the table
        path = os.path.join(out, mode, "history.json")
        if mode not in histories and os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            histories[mode], walls[mode] = saved["history"], saved["wall_s"]
            runs[mode] = saved.get("run")
    histories = {m: histories[m] for m in MODES if m in histories}
    base = row("sync", histories["sync"], None) if "sync" in histories else None  # every row's speed-up is over it
    rows = [row(mode, history, base) for mode, history in histories.items()]
    # the header describes the runs in the table (with --table, the saved ones', not this call's defaults)
    desc = run_desc if not a.table else next((r for r in runs.values() if r), None)
    what = ("runs of unrecorded settings" if desc is None else
            f"{desc['device']}, job {a.job}, {desc['prompts']} prompts x n={desc['n']}, responses up to "
            f"{desc['response']} tokens, {desc['steps']} steps per mode")
    print(f"\n### bench_async: {what} (means over the steps after the first); wall per mode: "
          + ", ".join(f"{m} {w:.0f} s" for m, w in walls.items()) + "\n")
    print(table(rows))
    with open(os.path.join(out, "bench_async.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
