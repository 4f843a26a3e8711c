#!/usr/bin/env python
"""Packed attention's kernels on one GPU: forward + backward of one layer's attention over one packed micro-batch,
torch's varlen kernel (`rlx_packed_varlen`) against SDPA per sequence (`rlx_packed_sdpa`), by CUDA events.

    python benchmarks/bench_attention.py [--seqs 110 --tokens 36556 --heads 14 --kv-heads 2 --head-dim 64]

The defaults are one micro-batch of the real GRPO job (Qwen2.5-Coder-0.5B, 64 prompts x 8, responses <= 400 tokens,
ppo_max_token_len_per_gpu=32768 in 36,556 packed tokens). Prints a table: kernel | ms | speed-up | max |diff|.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
    import torch

    from rlx.engine.attention import packed_attention, packed_kernel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, default=110)
    p.add_argument("--tokens", type=int, default=36556)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention: needs a CUDA GPU")
    g = torch.Generator().manual_seed(0)
    cuts = torch.randperm(a.tokens - 1, generator=g)[:a.seqs - 1].add(1).sort().values
    cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([a.tokens])]).to("cuda", torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    shape = lambda h: (1, h, a.tokens, a.head_dim)  # noqa: E731
    q, k, v = (torch.randn(shape(h), device="cuda", dtype=torch.bfloat16) for h in (a.heads, a.kv_heads, a.kv_heads))
    grad = torch.randn(1, a.tokens, a.heads, a.head_dim, device="cuda", dtype=torch.bfloat16)

    def step(kernel):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = packed_attention(*leaves, cu, longest, 0.0, None, kernel)
        out.backward(grad)
        return out.detach()

    rows = {}
    for kernel in ("sdpa-per-sequence", "varlen"):
        out = step(kernel)
        step(kernel)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(a.repeats):
            start.record()
            step(kernel)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        rows[kernel] = (sorted(times)[len(times) // 2], out)
    base_ms, base_out = rows["sdpa-per-sequence"]
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; this machine's packed kernel: "
          f"{packed_kernel('cuda')}; {a.seqs} sequences, {a.tokens} tokens, {a.heads}/{a.kv_heads} heads, "
          f"head dim {a.head_dim}, bf16, forward + backward (median of {a.repeats})")
    print("| kernel | ms | speed-up | max abs diff vs per-sequence |\n|---|---|---|---|")
    for kernel, (ms, out) in rows.items():
        print(f"| {kernel} | {ms:.2f} | {base_ms / ms:.1f}x | {(out.float() - base_out.float()).abs().max():.4f} |")


if __name__ == "__main__":
    main()
