#!/usr/bin/env python
"""Accuracy and format compliance per validation, from trainer.validation_data_dir's dumps (`<step>.jsonl`).

    python scripts/val_summary.py <run>/val [more runs ...] [--json out.json]

Accuracy is GSM8K's strict rule (the number after "#### " equals the ground truth, as rlx and verl score GSM8K);
format is the share of responses with "#### <number>" in their scored tail; flexible reads the last number.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def summarise(directory: str) -> list[dict]:
    from rlx.reward.rules.gsm8k import compute_score, extract_solution

    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl")), key=lambda p: int(os.path.basename(p)[:-6])):
        recs = [json.loads(line) for line in open(path)]
        n = len(recs)
        rows.append({"step": int(os.path.basename(path)[:-6]), "n": n,
                     "strict": sum(compute_score(r["output"], str(r["gts"])) for r in recs) / n,
                     "flexible": sum(compute_score(r["output"], str(r["gts"]), method="flexible") for r in recs) / n,
                     "format": sum(extract_solution(r["output"]) is not None for r in recs) / n,
                     "length": sum(len(r["output"]) for r in recs) / n})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    out = {}
    for d in args.dirs:
        rows = out[d] = summarise(d)
        print(f"\n{d}\n| step | problems | strict acc | flexible acc | format | response chars |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['step']} | {r['n']} | {r['strict']:.3f} | {r['flexible']:.3f} | {r['format']:.3f} | "
                  f"{r['length']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
