#!/usr/bin/env python
"""Plot a run's metrics.jsonl (trainer.logger has `file`): training reward, validation accuracy, response length
and entropy per step, one line per run.

    python scripts/plot_metrics.py <run>/logs/metrics.jsonl[=label[=<run>/val]] [more ...] --out plot.png

With a run's trainer.validation_data_dir (or its `val_summary.py --json` file) after its label, the validation panel shows the strict accuracy (solid) and
the format compliance (dashed) read from the dumped samples (scripts/val_summary.py) instead of the logged
validation reward (which includes any format_score).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

PANELS = [("training reward (mean score)", lambda m: m.get("critic/score/mean")),
          ("validation accuracy (greedy)", lambda m: next((v for k, v in sorted(m.items())
                                                          if k.startswith("val/") and k.endswith("/mean")), None)),
          ("response length (tokens)", lambda m: m.get("response_length/mean")),
          ("entropy", lambda m: m.get("actor/entropy"))]


def read(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="metrics.jsonl files, each optionally =label")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from val_summary import summarise

    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for run in args.runs:
        path, _, rest = run.partition("=")
        label, _, val_dir = rest.partition("=")
        records = read(path)
        for ax, (title, get) in zip(axes.flat, PANELS):
            if "validation" in title and val_dir:
                if val_dir.endswith(".json"):  # val_summary.py --json of one run
                    rows = next(iter(json.load(open(val_dir)).values()))
                else:
                    rows = summarise(val_dir)
                line, = ax.plot([r["step"] for r in rows], [r["strict"] for r in rows], marker="o", ms=3,
                                label=f"{label or path} accuracy")
                ax.plot([r["step"] for r in rows], [r["format"] for r in rows], ls="--", color=line.get_color(),
                        label=f"{label or path} format")
                ax.set_title("validation: accuracy (solid), format compliance (dashed)")
                ax.set_xlabel("step")
                ax.grid(alpha=0.3)
                continue
            pts = [(m["step"], get(m)) for m in records if "step" in m and get(m) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o" if "validation" in title else None, ms=3, label=label or path)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes.flat[1].legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
