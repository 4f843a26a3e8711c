#!/usr/bin/env python
"""A GSM8K run's validation curve: greedy strict and flexible accuracy and format compliance (read from the run's
trainer.validation_data_dir by scripts/val_summary.py), against the training step and against wall-clock minutes.

    .venv/bin/python scripts/plot_gsm8k_curve.py <run>/val <run>/logs/metrics.jsonl --launch-s 185 --out curve.png

Wall-clock minutes are those of one uninterrupted run: the launch (`--launch-s`: seconds from the command to the
first validation, as measured; the metrics do not hold it), then each step's own time, validation and checkpoint
save (`timing_s/step`, `timing_s/testing`, `timing_s/save_checkpoint`), so a run resumed across several time-limited
calls is drawn as one run. Where a resumed run repeated steps, the last record of a step counts. Prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def minutes_at_steps(metrics_path: str, launch_s: float) -> dict[int, float]:
    """Step -> wall-clock minutes at the end of that step's validation, for an uninterrupted run."""
    last: dict[int, dict] = {}
    with open(metrics_path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                last.setdefault(rec["step"], {}).update(rec)  # a repeated step: its last record wins
    elapsed, out = launch_s, {}
    for step in sorted(last):
        rec = last[step]
        elapsed += sum(rec.get(k, 0.0) for k in ("timing_s/step", "timing_s/testing", "timing_s/save_checkpoint"))
        out[step] = elapsed / 60
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("val_dir")
    p.add_argument("metrics")
    p.add_argument("--launch-s", type=float, required=True)
    p.add_argument("--title", default="GRPO on GSM8K")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from val_summary import summarise

    rows = summarise(a.val_dir)
    minutes = minutes_at_steps(a.metrics, a.launch_s)
    print("| step | minutes | strict | flexible | format |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {minutes.get(r['step'], float('nan')):.1f} | {r['strict']:.3f} | {r['flexible']:.3f} "
              f"| {r['format']:.3f} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, xs, label in ((axes[0], [r["step"] for r in rows], "training step"),
                          (axes[1], [minutes.get(r["step"], float("nan")) for r in rows], "wall-clock minutes")):
        for key, style in (("strict", "-o"), ("flexible", "--s"), ("format", ":^")):
            ax.plot(xs, [r[key] for r in rows], style, label=key, markersize=4)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GSM8K test (1,319, greedy)")
    axes[0].legend(loc="lower right")
    fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
