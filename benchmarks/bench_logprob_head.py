#!/usr/bin/env python
"""The fused log-prob head on one GPU: torch chunks vs the Triton backend (`fused_kernel_options.impl_backend`).

    python benchmarks/bench_logprob_head.py            # hidden 1536,3584 x tokens 8k,32k,131k, vocab 151936, bf16

For each shape and backend: the forward alone (no grad, as the old/ref log-prob passes), the forward + backward of
an actor-like loss (log-probs times an advantage, minus 0.01 x entropy) with gradients for the hidden states and
the head's weight, and that step's peak CUDA memory above its inputs. Times are medians of `--iters` runs after
one warm-up. The last lines are a table (markdown). Same chunk size for both backends unless `--chunks` lists more.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlx.ops import log_probs_from_hidden  # noqa: E402


def _time(fn, iters: int) -> float:
    """Median milliseconds of `fn` over `iters` runs, after one warm-up."""
    fn()
    out = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return statistics.median(out)


def _peak(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def bench(hidden_size: int, tokens: int, vocab: int, backend: str, chunk: int, iters: int, entropy: bool) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    dtype = torch.bfloat16
    hidden = torch.randn(tokens, hidden_size, device="cuda", dtype=dtype, generator=g).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, device="cuda", dtype=dtype, generator=g)
              / hidden_size ** 0.5).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    adv = torch.randn(tokens, device="cuda", generator=g)

    def head():
        return log_probs_from_hidden(hidden, weight, None, targets, 0.9, chunk_size=chunk, with_entropy=entropy,
                                     backend=backend)

    def forward():
        with torch.no_grad():
            head()

    def step():
        lp, ent = head()
        loss = -(lp * adv).mean() - (0.01 * ent.mean() if entropy else 0.0)
        loss.backward()
        hidden.grad = weight.grad = None

    fwd = _time(forward, iters)
    step_ms = _time(step, iters)
    peak = _peak(step)
    with torch.no_grad():
        lp, ent = head()
    out = dict(hidden=hidden_size, tokens=tokens, backend=backend, chunk=chunk, fwd_ms=fwd, step_ms=step_ms,
               peak_gib=peak, lp=lp[:4096].clone(), ent=None if ent is None else ent[:4096].clone())
    hidden = weight = targets = adv = None  # the closures above share these names: free the tensors through them
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", default="1536,3584")
    ap.add_argument("--tokens", default="8192,32768,131072")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunks", default="2048", help="fused_kernel_options.chunk_size values, each for both backends")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--no-entropy", action="store_true", help="log-probs only (entropy_coeff=0)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    import triton

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    rows = []
    for h in (int(x) for x in args.hidden.split(",")):
        for n in (int(x) for x in args.tokens.split(",")):
            for chunk in (int(x) for x in args.chunks.split(",")):
                res = {}
                for backend in ("torch", "triton"):
                    res[backend] = r = bench(h, n, args.vocab, backend, chunk, args.iters, not args.no_entropy)
                    print(f"hidden {h} tokens {n} chunk {chunk} {backend}: forward {r['fwd_ms']:.1f} ms, "
                          f"forward+backward {r['step_ms']:.1f} ms, peak {r['peak_gib']:.2f} GiB", flush=True)
                diff = (res["triton"]["lp"] - res["torch"]["lp"]).abs().max().item()
                if res["torch"]["ent"] is not None:
                    diff = max(diff, (res["triton"]["ent"] - res["torch"]["ent"]).abs().max().item())
                rows.append((res["torch"], res["triton"], diff))
    print("\n| hidden | tokens | chunk | forward ms torch / triton | fwd+bwd ms torch / triton | fwd+bwd speed-up | "
          "peak GiB torch / triton | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for t, x, diff in rows:
        print(f"| {t['hidden']} | {t['tokens']} | {t['chunk']} | {t['fwd_ms']:.1f} / {x['fwd_ms']:.1f} | "
              f"{t['step_ms']:.1f} / {x['step_ms']:.1f} | {t['step_ms'] / x['step_ms']:.2f}x | "
              f"{t['peak_gib']:.2f} / {x['peak_gib']:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
