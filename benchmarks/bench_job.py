#!/usr/bin/env python
"""The GRPO job on one GPU, vLLM rollout and HF rollout side by side, in one run (two jobs in sequence): where each
step's time and GPU memory go, and how much faster vLLM generates.

    python benchmarks/bench_job.py                       # ~6-8 min on one H100 (the HF rollout's step is most of it)

The job: Qwen2.5-0.5B dims with seeded random bf16 weights (a local directory written once by
`rlx.models.random_weights`; --model-dir to give one), 64 prompts x n=5 per step, up to 1024 response tokens (random
weights rarely emit EOS: nearly every response is 1024 tokens, the same work for both rollouts), GRPO with a KL loss
(so a ref pass), activation offload + gradient checkpointing, remove padding, dynamic batch size, the ref's params
offloaded, everything else at the GSM8K recipe's values (examples/grpo_trainer/run_grpo_gsm8k.sh). --vllm-steps (2) and
--hf-steps (1) steps; each job ends with a greedy validation on 8 prompts (outside the step).

`--rollouts vllm,vllm-async` runs the same job with the sync rollout and with the agent loop (rollout.mode=async,
single_turn_agent) on the same engine. `--multi-turn T` makes every job multi-turn: the tool agent of
tests/agent_helpers.py (a random-weight model writes no tool call, so it calls a probe tool after each turn), T
assistant turns of up to --turn-tokens tokens each, so with the defaults (T=8, 1024) a trajectory holds ~8.5k
tokens (the model's and the tools'); --response must hold them (e.g. --response 9216).

`--gpus 1,2` runs each rollout's job on 1 and then on 2 GPUs of this machine with the same batch per GPU (--prompts
prompts per GPU, FSDP2 and one vLLM engine per GPU) and ends with the scaling: whole-step and generated tokens per
second on N GPUs over 1 GPU (ideal: N).

Printed: each job's per-step phase view (`python -m rlx.trainer.phases`), then one table: seconds per phase (weight
sync, wake, generate, sleep, old log-prob, ref, update, the step; mean over the steps after the first when there are
several, else the one step), generated tokens per second, GPU memory in use after each phase (device-wide, GiB), and
the generation speed-up of vLLM over HF against the target (>= 10x). Each job's metrics stay in
<out>/<rollout>/logs/metrics.jsonl.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("RAY_LOG_TO_DRIVER", "0")  # workers' output stays in Ray's log folder (as with main_ppo)

ROWS = [  # (label, metric)
    ("weight sync", "timing_s/rollout/sync"),
    ("wake", "timing_s/rollout/wake"),
    ("generate", "timing_s/rollout/generate"),
    ("sleep", "timing_s/rollout/sleep"),
    ("gen (driver, all of the above)", "timing_s/gen"),
    ("old log-prob", "timing_s/old_log_prob"),
    ("ref", "timing_s/ref"),
    ("update actor", "timing_s/update_actor"),
    ("step", "timing_s/step"),
    ("generated tokens/s (per GPU)", "perf/rollout/generated_tokens_per_s"),
    ("step tokens/s (per GPU)", "perf/throughput"),
    ("mean response length", "response_length/mean"),
    ("turns per trajectory", "agent/num_turns/mean"),
    ("tool tokens per trajectory", "agent/tool_tokens/mean"),
    ("tool wait s per trajectory", "agent/tool_wait_s/mean"),
]
MEMORY = ("sync", "wake", "generate", "sleep", "old_log_prob", "ref", "update_actor")


def engine_of(rollout: str) -> str:
    return rollout.split("-")[0]


def agent_overrides(a, rollout: str, out: str) -> list[str]:
    """rollout `<engine>-async`: the agent loop; --multi-turn: the forced tool agent of tests/agent_helpers.py."""
    keys = [f"actor_rollout_ref.rollout.mode={'async' if rollout.endswith('-async') else 'sync'}"]
    if not a.multi_turn:
        return keys
    import agent_helpers

    os.makedirs(out, exist_ok=True)
    loops = os.path.join(out, "loops.yaml")
    with open(loops, "w") as f:
        f.write(f"- name: forced_tool_agent\n  _target_: agent_helpers.ForcedToolAgent\n"
                f"  turn_tokens: {a.turn_tokens}\n")
    r = "actor_rollout_ref.rollout"
    return keys + ["data.return_raw_chat=True", "data.max_prompt_length=64",
                   f'actor_rollout_ref.model.custom_chat_template="{agent_helpers.TEMPLATE}"',
                   f"{r}.multi_turn.enable=True", f"{r}.multi_turn.max_assistant_turns={a.multi_turn}",
                   f"{r}.multi_turn.function_tool_path={agent_helpers.__file__}",
                   f"{r}.agent.default_agent_loop=forced_tool_agent", f"{r}.agent.agent_loop_config_path={loops}"]


def job_overrides(a, rollout: str, model: str, out: str, gpus: int = 1) -> list[str]:
    steps = a.vllm_steps if engine_of(rollout) == "vllm" else a.hf_steps
    prompts = a.prompts * gpus  # the same batch per GPU
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files=synthetic://digits/size:{prompts * steps}/seed:0",
        "data.val_files=synthetic://digits/size:8/seed:1",
        f"data.train_batch_size={prompts}",
        "data.max_prompt_length=32",
        f"data.max_response_length={a.response}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.enable_activation_offload=True",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        f"actor_rollout_ref.rollout.name={engine_of(rollout)}",
        f"actor_rollout_ref.rollout.enforce_eager={a.smoke}",  # CUDA graphs on a GPU (verl's default)
        f"actor_rollout_ref.rollout.n={a.n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={a.gpu_memory_utilization}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        f"trainer.device={'cpu' if a.smoke else 'cuda'}",
        f"trainer.n_gpus_per_node={gpus}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out}",
    ] + agent_overrides(a, rollout, out)


def run_job(overrides: list[str]) -> tuple[list[dict], float]:
    from rlx.config import load_config
    from rlx.plan import make_plan
    from rlx.trainer.launch import run

    start = time.perf_counter()
    cfg = load_config(overrides, config_name="quickstart")
    trainer = run(cfg, make_plan(cfg))
    return trainer.history, time.perf_counter() - start


def summary(history: list[dict]) -> dict:
    """Mean of each metric over the steps after the first (warm-up) when there are several, else the one step."""
    steps = history[1:] if len(history) > 1 else history
    keys = {k for m in steps for k in m}
    return {k: sum(m[k] for m in steps if k in m) / sum(1 for m in steps if k in m) for k in keys}


def table(results: dict[str, dict]) -> str:
    names = list(results)
    header = ["phase"] + names
    rows = []
    for label, key in ROWS:
        cells = [results[n].get(key) for n in names]
        fmt = ".0f" if "tokens" in label else ".1f" if "length" in label else ".2f"
        rows.append([label] + ["-" if c is None else format(c, fmt) for c in cells])
    for phase in MEMORY:
        cells = [results[n].get(f"perf/gpu_memory_gib/after_{phase}") for n in names]
        rows.append([f"GPU memory after {phase}, GiB"] + ["-" if c is None else f"{c:.2f}" for c in cells])
    totals = [results[n].get("perf/gpu_memory_gib/total") for n in names]
    rows.append(["GPU memory total, GiB"] + ["-" if c is None else f"{c:.1f}" for c in totals])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              + " |" for r in rows]
    return "\n".join(lines)


def print_scaling(results: dict[str, dict], rollout: str, gpu_counts: list[int]) -> None:
    """Tokens per second of the whole job on N GPUs over 1 GPU (the per-GPU figures times N; ideal: N), for the
    whole step and for generation; and the step time's ratio (ideal: 1, the batch per GPU being the same)."""
    base = results.get(f"{rollout}-x1")
    for n in gpu_counts:
        got = results.get(f"{rollout}-x{n}")
        if n == 1 or base is None or got is None:
            continue
        parts = []
        for label, key in (("step tokens/s", "perf/throughput"), ("generated tokens/s",
                                                                   "perf/rollout/generated_tokens_per_s")):
            if base.get(key) and got.get(key):
                parts.append(f"{label} {got[key] * n:.0f} vs {base[key]:.0f} = {got[key] * n / base[key]:.2f}x")
        if base.get("timing_s/step") and got.get("timing_s/step"):
            parts.append(f"step time {got['timing_s/step']:.2f} vs {base['timing_s/step']:.2f} s = "
                         f"{got['timing_s/step'] / base['timing_s/step']:.2f}x (ideal 1.00)")
        print(f"\nscaling {rollout}, {n} GPUs over 1 (same batch per GPU; ideal {n:.2f}x): " + "; ".join(parts))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default=None, help="HF directory to train (default: random Qwen2.5-0.5B dims)")
    p.add_argument("--out", default=None, help="where the jobs' metrics go (default: a new temp dir)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--response", type=int, default=1024)
    p.add_argument("--vllm-steps", type=int, default=2)
    p.add_argument("--hf-steps", type=int, default=1)
    p.add_argument("--rollouts", default="vllm,hf", help="comma-separated, run in this order; <engine>-async: the "
                   "same engine under the agent loop (rollout.mode=async)")
    p.add_argument("--multi-turn", type=int, default=0, help="assistant turns of the forced tool agent (0: single "
                   "turn)")
    p.add_argument("--turn-tokens", type=int, default=1024, help="tokens per assistant turn with --multi-turn")
    p.add_argument("--gpus", default="1", help="comma-separated GPU counts: each rollout's job runs on each, with "
                   "--prompts prompts per GPU (e.g. 1,2: the scaling from 1 to 2 GPUs)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--target", type=float, default=10.0, help="vLLM/HF generated tokens/s to reach")
    p.add_argument("--smoke", action="store_true", help="a CPU check of this script: the built-in tiny model, "
                   "4 prompts x n=2, 16 tokens (with --prompts/--n/--response left at their defaults)")
    a = p.parse_args()
    if a.smoke:
        a.model_dir = a.model_dir or "builtin://tiny-qwen2"
        a.prompts, a.n, a.response = (4 if a.prompts == 64 else a.prompts), (2 if a.n == 5 else a.n), \
            (16 if a.response == 1024 else a.response)

    if a.multi_turn:  # the forced tool agent lives with the tests; Ray's workers inherit PYTHONPATH
        tests = os.path.join(ROOT, "tests")
        sys.path.insert(0, tests)
        os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, tests, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    import torch

    from rlx.models.random_weights import random_model_dir
    from rlx.trainer.phases import render

    if not torch.cuda.is_available() and not a.smoke:
        print("bench_job: needs a CUDA GPU (--smoke checks the script on CPU)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    model = a.model_dir or random_model_dir("qwen2.5-0.5b")
    out = a.out or tempfile.mkdtemp(prefix="rlx-bench-job-")
    device = (f"{torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"
              if not a.smoke else "CPU (smoke)")
    try:
        import vllm
        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = "not installed"
    print(f"bench_job: {device}; torch {torch.__version__}, vLLM {vllm_version}; model {model}; {a.prompts} prompts "
          f"x n={a.n}, responses up to {a.response} tokens; out {out}", flush=True)

    gpu_counts = [int(g) for g in a.gpus.split(",")]
    results, walls, steps = {}, {}, {}
    for rollout in a.rollouts.split(","):
        for gpus in gpu_counts:
            name = rollout if gpu_counts == [1] else f"{rollout}-x{gpus}"
            print(f"\n=== job with rollout.name={rollout} on {gpus} GPU(s) ===", flush=True)
            history, walls[name] = run_job(job_overrides(a, rollout, model, os.path.join(out, name), gpus))
            results[name] = summary(history)
            steps[name] = a.vllm_steps if engine_of(rollout) == "vllm" else a.hf_steps
            with open(os.path.join(out, name, "logs", "metrics.jsonl")) as f:
                records = [r for r in map(json.loads, f) if "timing_s/step" in r]
            print(f"\n--- {name}: per-step phases (python -m rlx.trainer.phases {out}/{name}/logs/metrics.jsonl)")
            print(render(records), flush=True)

    print(f"\n### GRPO job, {device}, vLLM {vllm_version}, torch {torch.__version__}")
    model_label = a.model_dir or "Qwen2.5-0.5B dims (random bf16 weights)"
    print(f"{model_label}, {a.prompts} prompts per GPU x n={a.n}, responses up to {a.response} "
          f"tokens, offload + checkpointing + remove padding + dynamic batch size, FSDP2, KL loss (ref pass). Seconds "
          f"per phase: mean over the steps after the first when a job has several ("
          + ", ".join(f"{r}: {s} step(s), job {walls[r]:.0f} s" for r, s in steps.items()) + ").\n")
    print(table(results))
    for rollout in a.rollouts.split(","):
        print_scaling(results, rollout, gpu_counts)
    if "vllm" in results and "hf" in results:
        v, h = (results[r].get("perf/rollout/generated_tokens_per_s") for r in ("vllm", "hf"))
        if v and h:
            ratio = v / h
            print(f"\nvLLM generates {ratio:.1f}x faster than HF ({v:.0f} vs {h:.0f} tokens/s); target >= "
                  f"{a.target:g}x: {'met' if ratio >= a.target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
