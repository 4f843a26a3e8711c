#!/usr/bin/env python
"""Memory of a long run: the quickstart job (built-in tiny model, 2 CPU workers) for --steps steps (50), the
driver's and each worker's resident memory (RSS) recorded at every step.

    python benchmarks/memory_check.py [--steps 50] [--out DIR] [key=value ...]

The job runs as the command line runs it (`python -m rlx.trainer.main_ppo --config-name quickstart`, no checkpoints,
no validation, file logger); this script samples, twice a second, the RSS of the driver and of the Ray workers it
started (its descendant processes named `ray::<Worker class>`), and each time a step's line lands in
`metrics.jsonl` records the latest sample under that step. Printed: a table per step (driver MiB, each worker's
MiB), then the growth of each from the end of the first third of the run to its end (the first steps warm up:
allocator pools, compiled kernels, Ray's object store client); written: <out>/memory.json with the same numbers.
tests/e2e/test_memory_long.py runs it and bounds the growth.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2 ** 20


def _workers(driver) -> dict[str, list]:
    """{pid: [worker class, rss bytes]} of the Ray workers under the driver (its local Ray's raylet's children; the
    process title is `ray::<class>.<method running now>`)."""
    import psutil

    out = {}
    for p in driver.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if cmd.startswith("ray::") and "Worker" in cmd.split()[0]:
                out[str(p.pid)] = [cmd.split()[0][5:].split(".")[0], p.memory_info().rss]
        except (psutil.NoSuchProcess, psutil.AccessDenied, IndexError):
            continue
    return out


def measure(steps: int, out_dir: str, overrides: list[str]) -> dict:
    import psutil

    ckpt = os.path.join(out_dir, "run")
    args = [sys.executable, "-m", "rlx.trainer.main_ppo", "--config-name", "quickstart",
            f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "trainer.logger=[console,file]", f"trainer.default_local_dir={ckpt}",
            *overrides]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    log_path = os.path.join(out_dir, "job.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    driver = psutil.Process(proc.pid)
    metrics = os.path.join(ckpt, "logs", "metrics.jsonl")
    per_step: dict[int, dict] = {}
    seen = 0
    while True:
        done = proc.poll() is not None
        try:
            sample = {"driver": driver.memory_info().rss, "workers": _workers(driver)}
        except psutil.NoSuchProcess:
            sample = None
        if os.path.exists(metrics):
            with open(metrics) as f:
                lines = f.read().splitlines()
            for line in lines[seen:]:
                try:
                    step = int(json.loads(line)["step"])
                except (ValueError, KeyError):
                    break
                if sample is not None:
                    per_step[step] = {"driver": sample["driver"], "workers": sample["workers"],
                                      "t": time.monotonic()}
                seen += 1
        if done:
            break
        time.sleep(0.5)
    if proc.returncode != 0:
        with open(log_path) as f:
            raise RuntimeError(f"the job exited {proc.returncode}:\n{f.read()[-3000:]}")
    return {"steps": steps, "per_step": per_step}


def growth(result: dict) -> dict[str, float]:
    """MiB each process grew from the end of the first third of the steps to the last step (the last step whose
    sample saw the workers, for theirs: the line of the run's last step may land after they stopped), by role and
    rank order, pids aside."""
    rows = [result["per_step"][s] for s in sorted(result["per_step"])]
    start = rows[len(rows) // 3]
    end = next(r for r in reversed(rows) if len(r["workers"]) == len(start["workers"]))
    out = {"driver": (rows[-1]["driver"] - start["driver"]) / MIB}
    for pid, (role, rss) in sorted(start["workers"].items()):
        if pid in end["workers"]:
            out[f"{role} pid {pid}"] = (end["workers"][pid][1] - rss) / MIB
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", default=None, help="folder for the run, its log and memory.json (default: a temp dir)")
    parser.add_argument("overrides", nargs="*")
    a = parser.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="rlx-memory-")
    os.makedirs(out, exist_ok=True)
    result = measure(a.steps, out, a.overrides)
    result["growth_mib"] = growth(result)
    print(f"{'step':>4} {'driver MiB':>10}  workers MiB")
    for step in sorted(result["per_step"]):
        row = result["per_step"][step]
        print(f"{step:>4} {row['driver'] / MIB:>10.1f}  "
              + "  ".join(f"{rss / MIB:.1f}" for _, (_, rss) in sorted(row["workers"].items())))
    for name, mib in result["growth_mib"].items():
        print(f"growth after step {sorted(result['per_step'])[len(result['per_step']) // 3]}: {name} {mib:+.1f} MiB")
    with open(os.path.join(out, "memory.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"written: {os.path.join(out, 'memory.json')}")


if __name__ == "__main__":
    main()
