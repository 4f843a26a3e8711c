#!/usr/bin/env python
"""A job's phases against their hardware floor, as one table: phase | measured | floor | ratio (measured / floor).

    # on the GPU machine, one call: train the job a few steps, then a fresh vLLM engine alone, then the table
    python benchmarks/bench_floor.py --train-steps 5 --vllm-alone <the job's key=value overrides>
    DATA_DIR=~/data/gsm8k python benchmarks/bench_floor.py --recipe examples/grpo_trainer/run_grpo_qwen_coder_gsm8k.sh \
        --train-steps 6 --vllm-alone [key=value ...]       # a recipe script's job, with more keys on top
    # an existing run's metrics (no GPU): trainer.logger=[console,file] wrote <default_local_dir>/logs/metrics.jsonl
    python benchmarks/bench_floor.py --metrics run/logs/metrics.jsonl --model-config qwen2.5-0.5b --gpu H100
    python benchmarks/bench_floor.py --metrics run/logs/metrics.jsonl <the job's overrides>   # dims from model.path

The overrides are `python -m rlx.trainer.main_ppo`'s (with --config-name, e.g. quickstart); `--recipe SCRIPT` takes
those a recipe script passes to main_ppo (the script runs with $PYTHON a stand-in that only records its arguments;
nothing trains), and the command line's come after them (the last value of a key wins). Modes:
- metrics (`--metrics PATH`, or the job's `<default_local_dir>/logs/metrics.jsonl`): measured seconds are the mean
  over the steps of a run after its first `--skip` (a file a resumed run appended to holds several runs: each run's
  first steps are dropped); the launch split (`timing_s/launch/*`, rlx.trainer.phases.LAUNCH) is read from the first
  step of the last run that logged it.
- `--train-steps K`: runs the job first (`python -m rlx.trainer.main_ppo`, K steps, a fresh run folder under --out,
  no checkpoints, trainer.logger=[console,file]) and reads its metrics.
- `--vllm-alone`: the generation floor. A fresh vLLM engine in this process, with the job's rollout settings (memory
  share, max_num_seqs, chunked prefill, engine_kwargs, ...), its model's own weights, no sleep mode and no weight
  sync, generates the job's first `--alone-batches` batches of prompts (data.train_files through rlx's dataset and
  loader: the same chat template, order and batches the trainer's first steps get; on N GPUs one engine's share)
  with the job's sampling (n, temperature, top-p/k, max tokens, log-probs, seed). Its rate is the mean over the
  batches after the first (the warm-up) when there are several.

Floors (per step, the run's mean step; N = trainer.nnodes x trainer.n_gpus_per_node GPUs):
- forward (old log-prob, ref, critic values): model FLOPs at 50% of the GPUs' bf16 dense peak (the issue's bar).
  Per sequence of L tokens, R of them response:
      F = L * 2 * P_layers  +  R * 2 * hidden * vocab  +  layers * 2 * heads * head_dim * L * (L + 1)
  P_layers: the decoder layers' matmul weights (q, k, v, o, gate, up, down); the LM head only at the R positions
  whose logits give the response's log-probs (a critic: its value head, 2 * hidden per position, instead); the
  attention term is QK^T and PV (2 * 2 * heads * head_dim per query-key pair) over the L (L + 1) / 2 causal pairs.
  From metrics the lengths are the step's means (rows = perf/total_num_tokens / (prompt + response mean), every row
  at the mean length: the attention term, ~2% here, is then slightly low). Embedding lookups, norms, rotary,
  softmax and the optimizer's elementwise work are left out (memory-bound; the AdamW steps of a 0.5B model read and
  write ~8 GB: milliseconds). The achieved rate (FLOPs / measured seconds) and its share of the peak are printed.
- update (actor, critic): backward = 2 x forward, so ppo_epochs x 3 x F. Gradient checkpointing's recompute is not
  counted (model FLOPs, not hardware FLOPs): it shows as a higher ratio.
- generation: the run's generated tokens (rows x response mean, per GPU) at vLLM alone's tokens/s (per engine).
- weight sync (`timing_s/rollout/sync`, async: `timing_s/sync_weights`): the model's parameters in the rollout
  dtype, read and written once at the GPU's memory bandwidth (a copy on one device); the measured GB/s is printed.
- step: the sum of the phases' floors (shown only when generation was measured).
- launch: measured only; the rollout engine's floor is vLLM alone's build time (same settings, weights from disk).
Peak: `--peak-tflops` (a number, or `measured`: an 8192^3 bf16 matmul on this GPU), else the spec sheet's dense bf16
figure for `--gpu` or this machine's GPU (H100 SXM and H200: 989 TFLOP/s; an 8192^3 matmul reaches ~790 on the H100s
measured so far); the header says which.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")

FLOOR_SHARE = 0.5
"""The share of the bf16 peak a floor assumes."""
GPUS = (  # (name fragment, dense bf16 TFLOP/s, memory GB/s) from the spec sheets; the first fragment found wins
    ("H100 PCIe", 756.0, 2000.0), ("H100 NVL", 835.0, 3900.0), ("H200", 989.0, 4800.0), ("H100", 989.0, 3350.0),
    ("H800", 989.0, 3350.0), ("A100", 312.0, 2039.0))
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class Dims:
    """A decoder's shape, as its HF config.json gives it."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, c: dict) -> "Dims":
        c = c.get("text_config", c)
        heads = int(c["num_attention_heads"])
        return cls(layers=int(c["num_hidden_layers"]), hidden=int(c["hidden_size"]),
                   intermediate=int(c["intermediate_size"]), heads=heads,
                   kv_heads=int(c.get("num_key_value_heads") or heads),
                   head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads), vocab=int(c["vocab_size"]),
                   tied=bool(c.get("tie_word_embeddings", False)))

    @property
    def layer_matmul_params(self) -> int:
        """One decoder layer's matmul weights: q and o (hidden x heads*head_dim), k and v (hidden x
        kv_heads*head_dim), the gated MLP (3 x hidden x intermediate)."""
        q = self.hidden * self.heads * self.head_dim
        kv = self.hidden * self.kv_heads * self.head_dim
        return 2 * q + 2 * kv + 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        """Every parameter (q/k/v biases and the norms included, as Qwen2 has them; a tied head once)."""
        biases = (self.heads + 2 * self.kv_heads) * self.head_dim
        layer = self.layer_matmul_params + biases + 2 * self.hidden
        embed = self.vocab * self.hidden
        return self.layers * layer + self.hidden + embed * (1 if self.tied else 2)


def load_dims(spec: str) -> Dims:
    """`spec`: a shape of rlx.models.random_weights (e.g. qwen2.5-0.5b), a config.json, or a model directory (a
    built-in `builtin://` name is materialised as the job would)."""
    from rlx.models.random_weights import SHAPES

    if spec in SHAPES:
        return Dims.from_config(SHAPES[spec])
    if spec.startswith("builtin://"):
        from rlx.models import resolve_model_path

        spec = resolve_model_path(spec)
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    try:
        with open(path) as f:
            return Dims.from_config(json.load(f))
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"--model-config {spec!r}: cannot read the model's dims from {path} ({e}). Fix: a model "
                         f"directory, its config.json, or one of {sorted(SHAPES)}") from None


# ---- FLOPs ---------------------------------------------------------------------------------------------------
def forward_flops(d: Dims, seq_lens, response_lens, value_head: bool = False) -> float:
    """Model FLOPs of one forward over sequences of `seq_lens` tokens (prompt + response), `response_lens` of them
    response (see the module docstring for the formula)."""
    body = 2 * d.layer_matmul_params * d.layers
    head = 2 * d.hidden * (1 if value_head else d.vocab)
    attn = 2 * d.layers * d.heads * d.head_dim
    return float(sum(L * body + R * head + attn * L * (L + 1) for L, R in zip(seq_lens, response_lens)))


def step_shape(m: dict) -> tuple[float, float, float]:
    """(rows, prompt mean, response mean) of a step from its metrics."""
    prompt, response = m["prompt_length/mean"], m["response_length/mean"]
    return m["perf/total_num_tokens"] / (prompt + response), prompt, response


def mean_forward_flops(d: Dims, m: dict, value_head: bool = False) -> float:
    """`forward_flops` of a step whose rows all have the mean lengths."""
    rows, prompt, response = step_shape(m)
    return rows * forward_flops(d, [prompt + response], [response], value_head)


# ---- metrics -------------------------------------------------------------------------------------------------
def runs(records: list[dict]) -> list[list[dict]]:
    """A metrics.jsonl's step records split into runs (a resumed run appends to the same file: its steps start
    again at or below the last one)."""
    out: list[list[dict]] = []
    for r in records:
        if not out or r.get("step", 0) <= out[-1][-1].get("step", 0):
            out.append([])
        out[-1].append(r)
    return out


def steady_mean(records: list[dict], skip: int) -> tuple[dict, list[int]]:
    """The mean of every metric over each run's steps after its first `skip`; and the steps it covers."""
    kept = [r for run in runs(records) for r in run[skip:]]
    if not kept:
        raise ValueError(f"--skip {skip} leaves no step of the {len(records)} in these metrics. Fix: a smaller "
                         f"--skip, or more training steps")
    keys = {k for r in kept for k, v in r.items() if isinstance(v, (int, float))}
    mean = {k: sum(r[k] for r in kept if k in r) / sum(1 for r in kept if k in r) for k in keys}
    return mean, [int(r.get("step", 0)) for r in kept]


def launch_record(records: list[dict]) -> dict:
    """`timing_s/launch/*` of the last run that logged them (its first step), without the prefix, in the launch's
    order (rlx.trainer.phases.LAUNCH), the total last."""
    from rlx.trainer.phases import LAUNCH

    logged = [r for r in records if "timing_s/launch/total" in r]
    if not logged:
        return {}
    return {p: logged[-1][f"timing_s/launch/{p}"] for p in LAUNCH + ("total",) if f"timing_s/launch/{p}" in logged[-1]}


# ---- the table -----------------------------------------------------------------------------------------------
@dataclass
class Hardware:
    gpu: str
    peak_tflops: float
    memory_gbs: float
    source: str
    """How the peak was chosen (spec sheet of a named GPU, given, measured)."""


@dataclass
class Job:
    """What the floors need from the job's config."""

    gpus: int = 1
    actor_epochs: int = 1
    critic_epochs: int = 1
    rollout_dtype: str = "bfloat16"


def _s(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def _ratio(measured: float | None, floor: float | None) -> str:
    if not measured or not floor:
        return "-"
    ratio = measured / floor
    return f"{ratio:.2f}" if ratio < 10 else f"{ratio:.0f}"


def floor_rows(m: dict, actor: Dims, critic: Dims | None, job: Job, hw: Hardware, alone: dict | None = None,
               launch: dict | None = None) -> list[tuple[str, str, str, str]]:
    """The table's rows from a step's mean metrics `m` (see the module docstring)."""
    rows: list[tuple[str, str, str, str]] = []
    rate = FLOOR_SHARE * hw.peak_tflops * 1e12 * job.gpus  # FLOP/s the floors assume
    floors: dict[str, float] = {}
    n_rows, _, response = step_shape(m)
    generated = n_rows * response / job.gpus  # tokens per GPU

    gen, gen_engine = m.get("timing_s/gen"), m.get("timing_s/rollout/generate")
    if gen is not None:
        if alone:
            floors["gen"] = generated / alone["tokens_per_s"]
            floor = f"{_s(floors['gen'])} (vLLM alone: {alone['tokens_per_s']:,.0f} tok/s)"
        else:
            floor = "vLLM alone: not measured (--vllm-alone)"
        rows.append(("generate (gen: wake, sync, generate, sleep)", f"{_s(gen)} ({generated / gen:,.0f} tok/s)",
                     floor, _ratio(gen, floors.get("gen"))))
        if gen_engine is not None:
            rows.append(("gen: the engine's generate", f"{_s(gen_engine)} ({generated / gen_engine:,.0f} tok/s)",
                         _s(floors["gen"]) if "gen" in floors else "-", _ratio(gen_engine, floors.get("gen"))))
    sync = m.get("timing_s/rollout/sync", m.get("timing_s/sync_weights"))
    if sync is not None:
        nbytes = actor.params * DTYPE_BYTES.get(job.rollout_dtype, 2)
        floor = 2 * nbytes / (hw.memory_gbs * 1e9)
        rows.append(("weight sync", f"{_s(sync)} ({nbytes / sync / 1e9:.3g} GB/s)",
                     f"{_s(floor)} ({nbytes / 1e9:.3g} GB read + written at {hw.memory_gbs:.0f} GB/s)",
                     _ratio(sync, floor)))

    def compute(key: str, label: str, flops: float) -> None:
        seconds = m.get(f"timing_s/{key}")
        if seconds is None:
            return
        floors[key] = flops / rate
        achieved = flops / seconds / job.gpus / 1e12
        rows.append((label, f"{_s(seconds)} ({achieved:.4g} TFLOP/s, {100 * achieved / hw.peak_tflops:.1f}% of peak)",
                     f"{_s(floors[key])} ({flops:.2e} FLOP)", _ratio(seconds, floors[key])))

    fwd = mean_forward_flops(actor, m)
    compute("old_log_prob", "old log-prob (forward)", fwd)
    compute("ref", "ref log-prob (forward)", fwd)
    if critic is not None:
        critic_fwd = mean_forward_flops(critic, m, value_head=True)
        compute("values", "critic values (forward)", critic_fwd)
        compute("update_critic", f"update critic (fwd + bwd, ppo_epochs={job.critic_epochs})",
                3 * job.critic_epochs * critic_fwd)
    compute("update_actor", f"update actor (fwd + bwd, ppo_epochs={job.actor_epochs})", 3 * job.actor_epochs * fwd)
    step = m.get("timing_s/step")
    if step is not None:
        total = sum(floors.values())
        whole = "gen" in floors or gen is None
        rows.append(("step", _s(step), f"{_s(total)} (the floors above)" if whole else
                     f"> {_s(total)} (generation not measured)", _ratio(step, total) if whole else "-"))
    for phase, seconds in (launch or {}).items():
        floor, ratio = "-", "-"
        if phase == "rollout_engine" and alone and alone.get("build_s"):
            floor, ratio = f"{_s(alone['build_s'])} (vLLM alone's build)", _ratio(seconds, alone["build_s"])
        rows.append((f"launch: {phase}", _s(seconds), floor, ratio))
    return rows


def render(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| phase | measured | floor | ratio |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(r)} |" for r in rows])


def header(m: dict, steps: list[int], actor: Dims, job: Job, hw: Hardware, alone: dict | None) -> str:
    n_rows, prompt, response = step_shape(m)
    fwd = mean_forward_flops(actor, m)
    lines = [f"### bench_floor: {hw.gpu} x {job.gpus}, bf16 dense peak {hw.peak_tflops:.0f} TFLOP/s ({hw.source}); "
             f"floor = {FLOOR_SHARE:.0%} of peak",
             f"- steps {steps[0]}..{steps[-1]} ({len(steps)} averaged): {m['perf/total_num_tokens']:,.0f} tokens a "
             f"step ({n_rows:.0f} rows, prompt {prompt:.1f} + response {response:.1f} tokens on average)",
             f"- model: {actor.layers} layers, hidden {actor.hidden}, intermediate {actor.intermediate}, "
             f"{actor.heads}/{actor.kv_heads} heads x {actor.head_dim}, vocab {actor.vocab}, "
             f"{'tied' if actor.tied else 'untied'} head; {actor.params / 1e6:.0f}M params; forward {fwd:.3g} FLOP "
             f"a step ({fwd / m['perf/total_num_tokens'] / 1e9:.3f} GFLOP/token)"]
    if alone:
        lines.append(f"- vLLM alone: {alone['prompts']} prompts x n={alone['n']} per batch, {alone['tokens']:,.0f} "
                     f"tokens in {alone['seconds']:.2f} s per batch (mean of {alone['measured']} after "
                     f"{alone['batches'] - alone['measured']} warm-up), engine built in {alone['build_s']:.1f} s")
    return "\n".join(lines)


def hardware(args) -> Hardware:
    """The peak and the memory bandwidth (see the module docstring); on a GPU machine the GPU's own name."""
    name = args.gpu
    if name is None:
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    spec = next((g for g in GPUS if name and g[0].lower() in name.lower()), None)
    memory = args.memory_gbs or (spec[2] if spec else None)
    if args.peak_tflops == "measured":
        peak, source = matmul_tflops(), "measured: an 8192^3 bf16 matmul here"
    elif args.peak_tflops is not None:
        peak, source = float(args.peak_tflops), "--peak-tflops"
    elif spec is not None:
        peak, source = spec[1], f"{spec[0]} spec sheet" + ("" if args.gpu is None else ", by --gpu")
    elif name is None:
        name, (_, peak, memory) = "H100 (assumed: no GPU here; --gpu names one)", GPUS[3]
        memory, source = args.memory_gbs or memory, "H100 spec sheet"
    else:
        raise ValueError(f"no peak known for the GPU {name!r}. Fix: --peak-tflops <dense bf16 TFLOP/s> (or "
                         f"measured) and --memory-gbs <GB/s>")
    if memory is None:
        raise ValueError(f"no memory bandwidth known for the GPU {name!r}. Fix: --memory-gbs <GB/s>")
    return Hardware(name, peak, memory, source)


def matmul_tflops(n: int = 8192, iters: int = 20) -> float:
    """The bf16 rate of an n^3 matmul on this GPU (TFLOP/s)."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * iters / (time.perf_counter() - start) / 1e12


# ---- the job and vLLM alone (they start processes or engines) --------------------------------------------------
def train_job(args, cfg, out: str) -> str:
    """Run the job `--train-steps` steps in a fresh folder under `out`; returns its metrics.jsonl."""
    import subprocess

    run_dir = os.path.join(out, "job")
    cmd = [sys.executable, "-m", "rlx.trainer.main_ppo"] + (["--config-name", args.config_name]
                                                           if args.config_name else [])
    cmd += args.overrides + [f"trainer.total_training_steps={args.train_steps}", "trainer.logger=[console,file]",
                             f"trainer.default_local_dir={run_dir}", "trainer.resume_mode=disable",
                             "trainer.save_freq=-1"]
    cmd += [f"trainer.{key}={os.path.join(run_dir, key)}" for key in ("validation_data_dir", "rollout_data_dir")
            if getattr(cfg.trainer, key)]  # the job's samples, when it keeps them: in the run folder
    log = os.path.join(out, "job.log")
    print(f"bench_floor: training {args.train_steps} steps; the job's output goes to {log}", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    with open(log, "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        with open(log) as f:
            tail = f.readlines()[-40:]
        raise SystemExit(f"bench_floor: the job failed (exit {code}); last lines of {log}:\n{''.join(tail)}")
    return os.path.join(run_dir, "logs", "metrics.jsonl")


def vllm_alone(cfg, batches: int) -> dict:
    """Generate the job's first `batches` batches (one engine's share) with a fresh vLLM engine alone (see the module
    docstring): prompts, n, tokens and seconds per batch, tokens/s, the engine's build seconds."""
    import dataclasses

    from rlx.data.custom import build_dataset
    from rlx.data.dataset import PromptLoader
    from rlx.workers.rollout import build_rank_engine

    arr, data, t = cfg.actor_rollout_ref, cfg.data, cfg.trainer
    r = arr.rollout
    if r.name != "vllm":
        raise ValueError(f"--vllm-alone: actor_rollout_ref.rollout.name={r.name!r}; the floor is vLLM's. Fix: "
                         f"actor_rollout_ref.rollout.name=vllm")
    if r.multi_turn.enable or r.mode != "sync":
        raise ValueError(f"--vllm-alone generates single-turn batches; this job's rollout is multi_turn.enable="
                         f"{r.multi_turn.enable}, mode={r.mode!r}. Fix: compare a sync single-turn job")
    tp = int(r.tensor_model_parallel_size)
    if tp != 1:
        raise ValueError(f"--vllm-alone runs one engine on one GPU: actor_rollout_ref.rollout."
                         f"tensor_model_parallel_size={tp}. Fix: a job with tensor_model_parallel_size=1")
    engines = t.nnodes * t.n_gpus_per_node
    import socket

    import torch.distributed as dist
    import vllm  # noqa: F401 - imported before the clock starts: the build alone is timed

    from rlx.engine.fsdp import init_distributed

    with socket.socket() as sock:  # this process a 1-rank group, as an actor worker's engine lives in one
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    device = init_distributed(t.device, rank=0, world_size=1, master_addr="127.0.0.1", master_port=port)
    start = time.perf_counter()
    # no sleep mode (nothing else shares the GPU) and the model's own weights (nothing is synced in)
    alone_cfg = dataclasses.replace(r, free_cache_engine=False, load_format="auto")
    rollout, tokenizer = build_rank_engine(cfg, "vllm", device, rank=0, world_size=1, rollout_cfg=alone_cfg)
    build_s = time.perf_counter() - start
    try:
        loader = PromptLoader(build_dataset(data.train_files, tokenizer, data), data.gen_batch_size or
                              data.train_batch_size, shuffle=data.shuffle, seed=data.seed)
        results = []
        for step in range(1, batches + 1):  # the trainer's sampling, as RayPPOTrainer.generate sets it
            share = loader.next_batch().chunk(engines)[0].select("input_ids", "attention_mask", "position_ids")
            share.meta = dict(n=r.n, do_sample=r.do_sample, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              seed=r.seed + step)
            begin = time.perf_counter()
            out = rollout.generate_sequences(share)
            results.append((time.perf_counter() - begin, float(out["response_mask"].sum()), len(share)))
            print(f"bench_floor: vLLM alone, batch {step}: {results[-1][1]:.0f} tokens in {results[-1][0]:.3f} s",
                  flush=True)
    finally:
        rollout.shutdown()
        dist.destroy_process_group()
    measured = results[1:] if len(results) > 1 else results
    seconds = sum(s for s, _, _ in measured) / len(measured)
    tokens = sum(k for _, k, _ in measured) / len(measured)
    return dict(prompts=results[0][2], n=r.n, batches=len(results), measured=len(measured), seconds=seconds,
                tokens=tokens, tokens_per_s=tokens / seconds, build_s=build_s)


def recipe_overrides(script: str) -> list[str]:
    """The arguments the recipe `script` gives `python -m rlx.trainer.main_ppo` (its $PYTHON a stand-in that writes
    them to a file; the script's other uses of $PYTHON do nothing)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="bench_floor-recipe-") as tmp:
        shim = os.path.join(tmp, "python")
        with open(shim, "w") as f:  # one file per call, each argument ended by a NUL
            f.write(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {tmp}/call.$$\n")
        os.chmod(shim, 0o755)
        proc = subprocess.run(["bash", script], env=dict(os.environ, PYTHON=shim), capture_output=True, text=True)
        runs = []
        for name in sorted(os.listdir(tmp)):
            if name.startswith("call."):
                with open(os.path.join(tmp, name)) as f:
                    runs.append(f.read().split("\0")[:-1])
    if proc.returncode != 0 or not runs:
        raise ValueError(f"--recipe {script}: the script failed (exit {proc.returncode}) or never ran $PYTHON: "
                         f"{proc.stderr.strip()[-500:]}. Fix: a recipe that runs \"$PYTHON\" -m "
                         f"rlx.trainer.main_ppo, with its environment set (e.g. DATA_DIR)")
    for argv in runs:
        if argv[:2] == ["-m", "rlx.trainer.main_ppo"]:
            return argv[2:]
    raise ValueError(f"--recipe {script}: the script never ran $PYTHON -m rlx.trainer.main_ppo. Fix: give the "
                     f"job's key=value overrides instead")


def job_of(cfg) -> Job:
    t, arr = cfg.trainer, cfg.actor_rollout_ref
    return Job(gpus=t.nnodes * t.n_gpus_per_node, actor_epochs=arr.actor.ppo_epochs,
               critic_epochs=cfg.critic.ppo_epochs, rollout_dtype=str(arr.rollout.dtype).replace("torch.", ""))


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Anything else: the job's key=value overrides (as main_ppo takes them).")
    p.add_argument("--metrics", help="a run's metrics.jsonl (default: the job's, or the --train-steps run's)")
    p.add_argument("--recipe", help="a recipe script: the overrides it passes to main_ppo come first")
    p.add_argument("--train-steps", type=int, help="train the job this many steps first and read its metrics")
    p.add_argument("--vllm-alone", action="store_true", help="measure the generation floor (vLLM alone)")
    p.add_argument("--alone-batches", type=int, default=3, help="batches vLLM alone generates; the first warms up")
    p.add_argument("--skip", type=int, default=1, help="first steps of each run left out of the mean")
    p.add_argument("--model-config", help="the model's dims: a config.json, a model directory or a shape of "
                   "rlx.models.random_weights (default: the job's actor_rollout_ref.model.path)")
    p.add_argument("--gpu", help="the GPU's name for its spec-sheet peak (default: this machine's)")
    p.add_argument("--peak-tflops", help="dense bf16 TFLOP/s of one GPU, or `measured`")
    p.add_argument("--memory-gbs", type=float, help="the GPU's memory bandwidth, GB/s")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of the run, without the job's config")
    p.add_argument("--config-name", "-cn", help="the config to compose (main_ppo's --config-name)")
    p.add_argument("--out", help="where --train-steps writes its run (default: a new temporary folder)")
    args, overrides = p.parse_known_args(argv)
    if args.recipe:
        recipe = recipe_overrides(args.recipe)
        for flag in ("--config-name", "-cn"):  # a recipe's own config
            if flag in recipe:
                at = recipe.index(flag)
                args.config_name = args.config_name or recipe[at + 1]
                del recipe[at:at + 2]
        overrides = recipe + overrides
    bad = [o for o in overrides if o.startswith("-") or "=" not in o]
    if bad:
        p.error(f"unknown arguments {bad} (overrides are key=value)")
    args.overrides = overrides
    if (args.train_steps or args.vllm_alone) and not (overrides or args.config_name):
        p.error("--train-steps and --vllm-alone need the job's config: its key=value overrides (or --config-name)")
    if not (args.metrics or args.train_steps or overrides or args.config_name):
        p.error("give --metrics PATH, or the job's overrides (its metrics.jsonl is read from its run folder)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cfg = None
    if args.overrides or args.config_name:
        from rlx.config import load_config

        cfg = load_config(args.overrides, config_name=args.config_name or "ppo_trainer")
    metrics = args.metrics
    if args.train_steps:
        metrics = train_job(args, cfg, args.out or tempfile.mkdtemp(prefix="bench_floor-"))
    elif metrics is None:
        metrics = os.path.join(cfg.trainer.default_local_dir, "logs", "metrics.jsonl")
    alone = vllm_alone(cfg, args.alone_batches) if args.vllm_alone else None
    from rlx.trainer.phases import read

    records = read(metrics)
    m, steps = steady_mean(records, args.skip)
    actor_spec = args.model_config or cfg.actor_rollout_ref.model.path
    actor = load_dims(actor_spec)
    critic = None
    if "timing_s/values" in m or "timing_s/update_critic" in m:
        critic = load_dims(cfg.critic.model.path) if cfg is not None and not args.model_config else actor
    job = job_of(cfg) if cfg is not None else Job(gpus=args.gpus)
    hw = hardware(args)
    rows = floor_rows(m, actor, critic, job, hw, alone, launch_record(records))
    print(f"\n{header(m, steps, actor, job, hw, alone)}\n- metrics: {metrics}\n\n{render(rows)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        print(f"rlx: {e}", file=sys.stderr)
        sys.exit(2)
