#!/usr/bin/env python
"""One row per job from the metrics its run logged (trainer.logger=[console,file]): validation reward at the first
and the last validation, training steps, median seconds per step / generation / actor update, the largest GPU
memory a worker allocated, the actor's activations offloaded per micro-batch, and the job's exit code when given.

    python scripts/jobs_table.py NAME=<default_local_dir>[:EXIT_CODE] ...

A job that logged no step shows why (its exit code) instead of numbers.
"""
from __future__ import annotations

import json
import os
import statistics
import sys


def read(log_dir: str) -> list[dict]:
    path = os.path.join(log_dir, "logs", "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def row(name: str, records: list[dict], rc: str) -> list[str]:
    steps = [r for r in records if "timing_s/step" in r]
    vals = [r for r in records if any(k.startswith("val/") and k.endswith("/reward/mean") for k in r)]
    if not steps:
        return [name, "-", "-", "-", "-", "-", "-", "-", rc or "?"]
    key = next(k for k in vals[0] if k.startswith("val/") and k.endswith("/reward/mean")) if vals else None
    reward = f"{vals[0][key]:.3f} -> {vals[-1][key]:.3f}" if key else "-"

    def median(k):
        xs = [r[k] for r in steps if k in r]
        return f"{statistics.median(xs):.2f}" if xs else "-"

    def largest(k, scale=1.0):
        xs = [r[k] * scale for r in steps if k in r]
        return f"{max(xs):.2f}" if xs else "-"

    return [name, reward, str(len(steps)), median("timing_s/step"), median("timing_s/gen"),
            median("timing_s/update_actor"), largest("perf/max_memory_allocated_gb"),
            largest("perf/update_actor/offloaded_activation_gb", 1024.0), rc or "-"]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    header = ["job", "val reward first -> last", "steps", "step s", "gen s", "update s", "peak GiB",
              "offloaded MiB", "exit"]
    rows = []
    for arg in argv:
        name, _, rest = arg.partition("=")
        log_dir, _, rc = rest.rpartition(":") if rest.rpartition(":")[2].isdigit() else (rest, "", "")
        rows.append(row(name, read(log_dir), rc))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
