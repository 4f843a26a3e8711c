"""Triton kernels of the fused log-prob head (`fused_kernel_options.impl_backend=triton`).

The chunked head (`rlx.ops.log_prob_head`) computes each chunk's logits `x = linear(h_c, W, b)` with cuBLAS, in
h's dtype. The torch backend then makes float32 copies of `x` (the scaled logits, the softmax, its product with
the logits: several `[chunk, V]` float32 tensors, each read and written once). Here one Triton program per token
reads its row of `x` once instead:

    forward   z = x / T (float32 in registers); online over blocks of the vocabulary:
              m = running max, s = sum exp(z - m), t = sum exp(z - m) * z   (s, t rescaled when m grows)
              lse = m + log s     log_prob = z[target] - lse     entropy = lse - t / s
    backward  p = exp(z - lse)    mean_z = lse - entropy
              dz = p * (-g_lp - g_ent * (z - mean_z)) + g_lp * onehot(target),  / T
              written over `x` in place (x's dtype), then grad_h = dz @ W, grad_W += dz^T h (cuBLAS)

so the only `[chunk, V]` tensor is `x` itself, in h's dtype. The math is the torch backend's, in float32.
A target outside `[0, V)` gives a NaN log-prob (the torch backend raises an index error).

Triton needs a GPU, or `TRITON_INTERPRET=1` (set before this module is imported), which runs the same kernels
on CPU tensors through numpy: the CPU tests do that.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

BLOCK_V = 4096  # vocabulary entries per step of a row's loop (a power of two)
NUM_WARPS = 8


# Row reductions through tl.reduce with rlx's own combine functions (what tl.max / tl.sum do): these are built
# when this module is imported, so TRITON_INTERPRET=1 set before that runs them in the interpreter even where
# triton itself was imported earlier without it (its own tl.max / tl.sum are then compiled-only).
@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _lse_entropy_fwd(x_ptr, stride_x, y_ptr, lp_ptr, ent_ptr, lse_ptr, V, inv_t,
                     WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_x
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    t = 0.0
    for start in range(0, V, BLOCK):
        offs = start + cols
        ok = offs < V
        z = tl.load(base + offs, mask=ok, other=-float("inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, tl.reduce(z, 0, _max))
        scale = tl.exp(m - m_new)
        e = tl.exp(z - m_new)  # 0 where masked
        s = s * scale + tl.reduce(e, 0, _add)
        if WITH_ENTROPY:
            t = t * scale + tl.reduce(e * tl.where(ok, z, 0.0), 0, _add)
        m = m_new
    lse = m + tl.log(s)
    target = tl.load(y_ptr + row)
    valid = (target >= 0) & (target < V)
    z_t = tl.load(base + target, mask=valid, other=float("nan")).to(tl.float32) * inv_t
    tl.store(lp_ptr + row, z_t - lse)
    tl.store(lse_ptr + row, lse)
    if WITH_ENTROPY:
        tl.store(ent_ptr + row, lse - t / s)


@triton.jit
def _grad_logits_bwd(x_ptr, stride_x, y_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, V, inv_t,
                     HAS_LP: tl.constexpr, HAS_ENT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_x
    cols = tl.arange(0, BLOCK)
    lse = tl.load(lse_ptr + row)
    target = tl.load(y_ptr + row)
    g_lp = 0.0
    if HAS_LP:
        g_lp = tl.load(glp_ptr + row)
    g_ent = 0.0
    mean_z = 0.0
    if HAS_ENT:
        g_ent = tl.load(gent_ptr + row)
        mean_z = lse - tl.load(ent_ptr + row)
    for start in range(0, V, BLOCK):
        offs = start + cols
        ok = offs < V
        z = tl.load(base + offs, mask=ok, other=0.0).to(tl.float32) * inv_t
        p = tl.exp(z - lse)
        coef = -g_lp - g_ent * (z - mean_z)
        dz = p * coef + tl.where(offs == target, g_lp, 0.0)
        tl.store(base + offs, (dz * inv_t).to(x_ptr.dtype.element_ty), mask=ok)


def lse_entropy(x: torch.Tensor, y: torch.Tensor, temperature: float, log_probs: torch.Tensor, lse: torch.Tensor,
                entropy: Optional[torch.Tensor]) -> None:
    """Fill `log_probs`, `lse` (and `entropy`) `[n]` float32 from the chunk's raw logits `x` `[n, V]` (`z = x / T`)."""
    n, v = x.shape
    assert x.stride(1) == 1 and y.is_contiguous() and log_probs.is_contiguous() and lse.is_contiguous()
    if n == 0:
        return
    _lse_entropy_fwd[(n,)](x, x.stride(0), y, log_probs, lse if entropy is None else entropy, lse, v,
                           1.0 / temperature, WITH_ENTROPY=entropy is not None, BLOCK=BLOCK_V, num_warps=NUM_WARPS)


def grad_logits_(x: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, entropy: Optional[torch.Tensor],
                 g_lp: Optional[torch.Tensor], g_ent: Optional[torch.Tensor], temperature: float) -> torch.Tensor:
    """Overwrite the chunk's raw logits `x` `[n, V]` with d(loss)/dx given the output gradients (None: zero)."""
    n, v = x.shape
    assert x.stride(1) == 1 and (g_lp is not None or g_ent is not None)
    assert g_ent is None or entropy is not None
    if n == 0:
        return x
    _grad_logits_bwd[(n,)](x, x.stride(0), y, lse, lse if entropy is None else entropy,
                           lse if g_lp is None else g_lp.contiguous(), lse if g_ent is None else g_ent.contiguous(),
                           v, 1.0 / temperature, HAS_LP=g_lp is not None, HAS_ENT=g_ent is not None,
                           BLOCK=BLOCK_V, num_warps=NUM_WARPS)
    return x
