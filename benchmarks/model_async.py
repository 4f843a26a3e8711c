#!/usr/bin/env python
"""A model of the disaggregated pipeline at a staleness bound (docs/async.md): seconds per step from an engine's cost
per step (by requests in flight, `bench_rollout_engine.py --curve`), the trainer's seconds per batch and the job's
response lengths. No GPU, no vLLM: it replays the admission rule (batch k starts once the weights of step k - 1 -
bound are on the rollout), the engine stepping every open response together, and the trainer taking batches in order.

    python benchmarks/model_async.py                                    # the long-tail job, one and two engines
    python benchmarks/model_async.py --curve 1:1.6,16:2.07,64:3.9,256:8.25,512:14.7 --train-s 12.8 --bound 1

It is a model: the engines' cost is the curve's (what one engine alone costs), with no syncs, prefill or CPU
contention; compare its seconds per step with a measured run's before trusting its other columns.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

LONGTAIL_CURVE = "1:2.0,16:3.0,64:3.7,256:11.2,512:25.6"
"""ms per engine step by requests in flight: one H100, vLLM 0.22, the long-tail model (docs/async.md)."""


def parse_curve(text: str) -> tuple[list[int], list[float]]:
    pairs = sorted((int(n), float(ms)) for n, ms in (p.split(":") for p in text.split(",")))
    return [n for n, _ in pairs], [ms / 1e3 for _, ms in pairs]


def step_cost(curve, live: int) -> float:
    """Seconds per engine step with `live` requests: the curve, linear between its points and past its last."""
    xs, ys = curve
    if live <= xs[-1]:
        return float(np.interp(live, xs, ys))
    return ys[-1] + (live - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])


def lengths(rng, n: int, cap: int, clip: float, mean: float) -> np.ndarray:
    """Response lengths: a share `clip` runs to the cap, the others geometric with `mean` (capped)."""
    out = np.minimum(rng.geometric(1 / mean, n), cap)
    out[rng.random(n) < clip] = cap
    return out


def simulate(curve, train_s: float, *, bound: int = 1, batch: int = 256, engines: int = 1, steps: int = 14,
             cap: int = 4096, clip: float = 0.065, mean: float = 600.0, seed: int = 0) -> dict:
    """One run: mean seconds per step (after the first one or two) and mean G (a batch's seconds from its start to its last
    token). `engines` split each batch's requests evenly; each engine steps its own share at the curve's cost."""
    rng = np.random.default_rng(seed)
    todo = {k: lengths(rng, batch, cap, clip, mean) for k in range(1, steps + 1)}
    start, done, end = {}, {}, {0: 0.0}
    live: list[list[int]] = []  # [batch, tokens left]
    t, nxt, trained = 0.0, 1, 1

    def admitted_at(k: int) -> float | None:  # the weights of step k - 1 - bound are on the rollout
        return 0.0 if k - 1 - bound <= 0 else end.get(k - 1 - bound)

    while trained <= steps:
        while nxt <= steps and admitted_at(nxt) is not None and admitted_at(nxt) <= t:
            start[nxt] = t
            live += [[nxt, int(n)] for n in todo[nxt]]
            nxt += 1
        if live:
            dt = step_cost(curve, max(1, len(live) // engines))
            admit = admitted_at(nxt) if nxt <= steps else None
            k = min(r[1] for r in live)
            if admit is not None and admit > t:  # stop at the next admission
                k = max(1, min(k, int((admit - t) / dt) + 1))
            t += k * dt
            for r in live:
                r[1] -= k
            live = [r for r in live if r[1] > 0]
            for b in start:
                if b not in done and not any(r[0] == b for r in live):
                    done[b] = t
        else:
            t = min([v for v in end.values() if v > t] + [t + 0.01])
        while trained in done and trained <= steps:
            end[trained] = max(end[trained - 1], done[trained]) + train_s
            trained += 1
    ends = [end[k] for k in range(1, steps + 1)]
    first = 1 if (steps - 2) % 2 == 0 else 2  # an even number of steps: at bound 1 they alternate in pairs
    return {"s/step": (ends[-1] - ends[first]) / (steps - 1 - first),
            "G": float(np.mean([done[k] - start[k] for k in range(3, steps + 1)]))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--curve", default=LONGTAIL_CURVE, help="requests:ms pairs, comma-separated")
    p.add_argument("--train-s", type=float, default=12.8, help="the trainer's seconds per batch")
    p.add_argument("--bound", type=int, default=1, help="the staleness bound")
    p.add_argument("--batch", type=int, default=256, help="responses per batch")
    p.add_argument("--engines", default="1,2", help="engines sharing the rollout's requests")
    p.add_argument("--clip", type=float, default=0.065, help="share of responses at the cap")
    p.add_argument("--mean", type=float, default=600.0, help="mean length of the others")
    p.add_argument("--cap", type=int, default=4096)
    p.add_argument("--runs", type=int, default=4)
    a = p.parse_args()
    curve = parse_curve(a.curve)
    print(f"| engines | s/step | G s |  (bound {a.bound}, {a.batch} responses, train {a.train_s} s)\n|---|---|---|")
    for engines in [int(e) for e in a.engines.split(",")]:
        runs = [simulate(curve, a.train_s, bound=a.bound, batch=a.batch, engines=engines, cap=a.cap, clip=a.clip,
                         mean=a.mean, seed=s) for s in range(a.runs)]
        print(f"| {engines} | {np.mean([r['s/step'] for r in runs]):.1f} | {np.mean([r['G'] for r in runs]):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
