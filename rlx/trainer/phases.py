"""Where a training step's time and GPU memory go, read from the metrics a run logged.

    python -m rlx.trainer.phases <default_local_dir>/logs/metrics.jsonl     # trainer.logger=[console,file]

prints one row per step: seconds per phase (`timing_s/*`: the rollout's wake / weight sync / generate / sleep inside
`gen`, then reward, old log-prob, ref, values, advantages, the updates, validation, checkpoint, and what is left of
the step), the rollout's generated tokens per second, and, on CUDA, the GPU memory in use after each phase
(`perf/gpu_memory_gib/after_*`, device-wide), then where the launch went (`timing_s/launch/*`, on the first step a
process trains: `LaunchTiming`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager

ROLLOUT = ("rollout/wake", "rollout/sync", "rollout/generate", "rollout/sleep")
"""Parts of `gen` measured in the actor worker."""
PHASES = ("gen", "gen_baseline", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
          "testing", "save_checkpoint")
"""The driver's phases of a step, in order (`timing_s/<phase>`); their sum and the rest make `timing_s/step`."""
MEMORY = ("sync", "wake", "generate", "sleep", "old_log_prob", "ref", "values", "update_critic", "update_actor")
"""`perf/gpu_memory_gib/after_<phase>`, in the order the phases run."""
TOKENS_PER_S = "perf/rollout/generated_tokens_per_s"
LAUNCH = ("before_ray", "ray_init", "trainer", "workers", "init_actor", "rollout_engine", "init_critic",
          "init_reward_model", "loggers", "resume", "validation")
"""The launch's phases, in order (`timing_s/launch/<phase>`): the process's start to `ray.init` (imports, config,
preflight: data, tokenizer, model checks), `ray.init`, the driver's trainer (loaders, reward), the worker processes'
start and rendezvous, each role's model build (`rollout_engine`: the rollout engines' build; colocated, the part of
`init_actor` the actor workers spent on it, slowest rank; an async run's rollout workers, before the actor's),
the loggers, the checkpoint load and the validation before training. `timing_s/launch/total`: the process's start to
its first training step."""


def process_age_s() -> float:
    """Seconds since this process started (the OS's record of its start)."""
    import psutil

    return max(0.0, time.time() - psutil.Process().create_time())


class LaunchTiming:
    """The driver's launch phases (`LAUNCH`), logged once as `timing_s/launch/*` with the first step this process
    trains (a resumed run: its first step after the resume)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.total: float | None = None
        self.reported = False

    def add(self, phase: str, seconds: float) -> None:
        assert phase in LAUNCH, phase
        self.seconds[phase] = self.seconds.get(phase, 0.0) + float(seconds)

    @contextmanager
    def phase(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def first_step_starts(self) -> None:
        """The launch is over: its total is the process's age now."""
        if self.total is None:
            self.total = process_age_s()

    def metrics(self) -> dict[str, float]:
        """`timing_s/launch/*` the first time (then nothing)."""
        if self.reported:
            return {}
        self.reported = True
        out = {f"timing_s/launch/{k}": v for k, v in self.seconds.items()}
        if self.total is not None:
            out["timing_s/launch/total"] = self.total
        return out


def read(path: str) -> list[dict]:
    """The step records of a metrics.jsonl (validation-only records, without `timing_s/step`, are skipped)."""
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if "timing_s/step" in r]


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(records: list[dict]) -> str:
    if not records:
        return "no training steps in these metrics (a run logs them with trainer.logger=[console,file])"
    rollout = [p for p in ROLLOUT if any(f"timing_s/{p}" in r for r in records)]
    phases = [p for p in PHASES if any(f"timing_s/{p}" in r for r in records)]
    header = ["step"] + [p.replace("rollout/", "gen:") for p in rollout] + phases + ["other", "step_s"]
    has_tps = any(TOKENS_PER_S in r for r in records)
    if has_tps:
        header.append("gen_tok/s")
    rows = []
    for r in records:
        step_s = r["timing_s/step"]
        known = sum(r.get(f"timing_s/{p}", 0.0) for p in phases if p not in ("testing", "save_checkpoint"))
        row = [str(r.get("step", "?"))] + [_num(r.get(f"timing_s/{p}"), ".2f") for p in rollout + phases]
        row += [f"{step_s - known:.2f}", f"{step_s:.2f}"]
        if has_tps:
            row.append(_num(r.get(TOKENS_PER_S), ".0f"))
        rows.append(row)
    out = ["seconds per phase (gen:* are parts of gen; other: the rest of timing_s/step; testing and "
           "save_checkpoint come after the step)", _table(header, rows)]
    memory = [p for p in MEMORY if any(f"perf/gpu_memory_gib/after_{p}" in r for r in records)]
    if memory:
        total = max(r.get("perf/gpu_memory_gib/total", 0.0) for r in records)
        mrows = [[str(r.get("step", "?"))] + [_num(r.get(f"perf/gpu_memory_gib/after_{p}"), ".2f") for p in memory]
                 for r in records]
        out += ["", f"GPU memory in use after each phase, GiB (device-wide, of {total:.1f})",
                _table(["step"] + memory, mrows)]
    launch = [r for r in records if "timing_s/launch/total" in r]
    if launch:
        phases = [p for p in LAUNCH if any(f"timing_s/launch/{p}" in r for r in launch)]
        lrows = [[str(r.get("step", "?"))] + [_num(r.get(f"timing_s/launch/{p}"), ".1f") for p in phases + ["total"]]
                 for r in launch]
        out += ["", "seconds from the process's start to its first step (rollout_engine: part of init_actor when "
                    "colocated)",
                _table(["step"] + phases + ["total"], lrows)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlx.trainer.phases", description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", help="a run's metrics.jsonl (<default_local_dir>/logs/metrics.jsonl)")
    args = parser.parse_args(argv)
    try:
        records = read(args.metrics)
    except OSError as e:
        print(f"cannot read {args.metrics}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(render(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
