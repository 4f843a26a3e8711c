"""Per-token log-probs (and entropy) straight from the last hidden states, without the `[N, V]` logits.

The LM head's logits are the largest activation of a policy update: `N` tokens x a vocabulary of ~150k, in
float32 for the log-softmax, plus the gradient of the same size. `log_probs_from_hidden` with a `chunk_size`
computes them `chunk_size` tokens at a time:

    forward   z_c = linear(h_c, W, b).float() / T      lse_c = logsumexp(z_c)
              log_prob_c = z_c[target] - lse_c         entropy_c = lse_c - sum(softmax(z_c) * z_c)
    backward  recompute z_c;  p = exp(z_c - lse_c)
              dz = g_lp * (onehot - p) + g_ent * (-p * (z_c - sum(p * z_c)))      (fp32, / T, to h's dtype)
              grad_h_c = dz @ W      grad_W += dz^T @ h_c      grad_b += sum(dz)   (W and b in fp32 buffers)

Saved for backward: the inputs (hidden, weight, bias, targets) and one float32 logsumexp per token, i.e. per
token H hidden values + 4 + 8 bytes, where the full path keeps float32 logits-sized tensors (>= 4 V bytes per
token, several of them); nothing of size N x V. The transient peak is a few `[chunk_size, V]` float32
tensors. The head's matmul runs once more in backward (as under activation checkpointing). Under no_grad, or
when nothing needs a gradient, it is the same chunked loop and saves nothing.
Without a chunk size it is the full-logits reference: `logprobs_from_logits` / `entropy_from_logits` of
`linear(h, W, b).float() / T`, the math of the actor's log-prob path (verl's unfused head). There verl's two entropy
keys apply: `entropy_chunk_size` (`entropy_from_logits_with_chunking`) computes the entropy that many rows at a time,
and `entropy_checkpointing` recomputes the entropy from the logits in backward (`torch.utils.checkpoint`) instead of
saving its `[N, V]` softmax. The chunked head needs neither: it already computes the entropy chunk by chunk and
recomputes each chunk in backward, saving nothing of size N x V.

`backend="triton"` (`fused_kernel_options.impl_backend`): the same chunks and matmuls, but the per-chunk softmax
math runs in `rlx.ops.triton_head`'s kernels, one read of the chunk's logits in forward and one in-place rewrite
of them into their gradient in backward, in place of the float32 copies above (it also saves the entropy `[N]`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from rlx.algos import core_algos

__all__ = ["BACKENDS", "log_probs_from_hidden", "sum_pi_squared_from_hidden"]

BACKENDS = ("torch", "triton")  # the chunked head's implementations (fused_kernel_options.impl_backend)


def log_probs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                          targets: torch.Tensor, temperature: float = 1.0, *, chunk_size: Optional[int],
                          with_entropy: bool, entropy_chunk_size: Optional[int] = None,
                          entropy_checkpointing: bool = False,
                          backend: str = "torch") -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-prob of `targets` `[N]` (float32) and, if `with_entropy`, the entropy `[N]` (float32) of the
    distribution `softmax(linear(hidden, weight, bias) / temperature)`.

    hidden `[N, H]` (or `[..., H]` with targets `[...]`), weight `[V, H]` (the LM head, possibly a tied
    embedding), bias `[V]` or None, targets int64. `chunk_size` None or <= 0: the full-logits reference path;
    > 0: chunks of that many tokens, never materialising `[N, V]` (see the module docstring).
    `entropy_chunk_size` / `entropy_checkpointing`: the full-logits path's entropy in chunks of that many rows /
    recomputed in backward (ignored by the chunked head, which does both by construction).
    `backend`: the chunked head's per-chunk math, "torch" or "triton" (`rlx.ops.triton_head`; ignored without
    a chunk size).
    """
    assert backend in BACKENDS, backend
    if chunk_size is None or chunk_size <= 0:
        logits = F.linear(hidden, weight, bias).float() / temperature
        log_probs = core_algos.logprobs_from_logits(logits, targets)
        entropy = _entropy(logits, entropy_chunk_size, entropy_checkpointing) if with_entropy else None
        return log_probs, entropy
    lead = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    y = targets.reshape(-1).long()
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if needs_grad:
        outs = _ChunkedLogProbs.apply(h, weight, bias, y, float(temperature), int(chunk_size), bool(with_entropy),
                                      backend)
        log_probs, entropy = outs if with_entropy else (outs, None)
    else:
        with torch.no_grad():
            log_probs, entropy, _ = _forward_chunks(h, weight, bias, y, float(temperature), int(chunk_size),
                                                    bool(with_entropy), backend)
    if log_probs.shape != lead:  # (a same-shape reshape would hand FSDP2 a view as the module's output)
        log_probs, entropy = log_probs.reshape(lead), None if entropy is None else entropy.reshape(lead)
    return log_probs, entropy


def _entropy(logits: torch.Tensor, chunk: Optional[int], checkpointing: bool) -> torch.Tensor:
    """Entropy of full logits; with `checkpointing` (and a gradient to take) only `logits` is saved for backward,
    where the entropy's softmax is recomputed."""
    if checkpointing and torch.is_grad_enabled() and logits.requires_grad:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(core_algos.entropy_from_logits, logits, chunk, use_reentrant=False)
    return core_algos.entropy_from_logits(logits, chunk)
@torch.no_grad()
def sum_pi_squared_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                               temperature: float = 1.0, *, chunk_size: Optional[int]) -> torch.Tensor:
    """``sum_v pi_v^2`` (float32, no gradient) of ``softmax(linear(hidden, weight, bias) / temperature)`` per token,
    ``chunk_size`` tokens at a time (None or <= 0: all at once, as the full-logits path)."""
    lead = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1])
    n = h.shape[0]
    chunk = chunk_size if chunk_size and chunk_size > 0 else max(n, 1)
    out = torch.empty(n, dtype=torch.float32, device=h.device)
    for s in range(0, n, chunk):
        z = F.linear(h[s:s + chunk], weight, bias).float() / temperature
        out[s:s + chunk] = core_algos.sum_pi_squared_from_logits(z)
    return out.reshape(lead)


def _forward_chunks(h, weight, bias, y, temperature: float, chunk: int, with_entropy: bool, backend: str):
    """(log_probs, entropy or None, logsumexp), each `[N]` float32, computed `chunk` tokens at a time."""
    if backend == "triton":
        from rlx.ops import triton_head
    n = h.shape[0]
    log_probs = torch.empty(n, dtype=torch.float32, device=h.device)
    lse = torch.empty_like(log_probs)
    entropy = torch.empty_like(log_probs) if with_entropy else None
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        if backend == "triton":
            triton_head.lse_entropy(F.linear(h[s:e], weight, bias), y[s:e], temperature, log_probs[s:e], lse[s:e],
                                    None if entropy is None else entropy[s:e])
            continue
        z = F.linear(h[s:e], weight, bias).float().div_(temperature)  # a fresh tensor even when float32
        lse_c = torch.logsumexp(z, dim=-1)
        lse[s:e] = lse_c
        log_probs[s:e] = z.gather(-1, y[s:e].unsqueeze(-1)).squeeze(-1) - lse_c
        if entropy is not None:  # with_entropy
            entropy[s:e] = lse_c - torch.softmax(z, dim=-1).mul_(z).sum(dim=-1)
    return log_probs, entropy, lse


class _ChunkedLogProbs(torch.autograd.Function):
    """Chunked log-prob (and entropy) head; backward recomputes each chunk's logits from the saved inputs."""

    @staticmethod
    def forward(ctx, h, weight, bias, y, temperature: float, chunk: int, with_entropy: bool, backend: str):
        log_probs, entropy, lse = _forward_chunks(h, weight, bias, y, temperature, chunk, with_entropy, backend)
        ctx.save_for_backward(h, weight, bias, y, lse, entropy if backend == "triton" else None)
        ctx.temperature, ctx.chunk, ctx.backend = temperature, chunk, backend
        ctx.set_materialize_grads(False)
        return (log_probs, entropy) if with_entropy else log_probs

    @staticmethod
    def backward(ctx, g_lp, g_ent=None):
        h, weight, bias, y, lse, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g_lp is None and g_ent is None:
            return (None,) * 8
        n, temperature = h.shape[0], ctx.temperature
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for s in range(0, n, ctx.chunk):
            e = min(s + ctx.chunk, n)
            h_c = h[s:e]
            if ctx.backend == "triton":
                from rlx.ops import triton_head

                dz = triton_head.grad_logits_(F.linear(h_c, weight, bias), y[s:e], lse[s:e],
                                              None if entropy is None else entropy[s:e],
                                              None if g_lp is None else g_lp[s:e],
                                              None if g_ent is None else g_ent[s:e], temperature)
                _chunk_grads(dz.to(h.dtype), h_c, weight, grad_h, grad_w, grad_b, s, e)
                continue
            z = F.linear(h_c, weight, bias).float().div_(temperature)
            p = torch.sub(z, lse[s:e].unsqueeze(-1)).exp_()
            if g_ent is not None:  # d entropy / dz = -p * (z - sum(p * z))
                mean_z = (p * z).sum(dim=-1, keepdim=True)
                dz = z.sub_(mean_z).mul_(p).mul_(-g_ent[s:e].unsqueeze(-1))
                if g_lp is not None:
                    dz.sub_(p.mul_(g_lp[s:e].unsqueeze(-1)))
            else:
                dz = p.mul_(-g_lp[s:e].unsqueeze(-1))
            if g_lp is not None:  # d log_prob / dz = onehot(target) - p
                dz.scatter_add_(-1, y[s:e].unsqueeze(-1), g_lp[s:e].unsqueeze(-1).to(dz.dtype))
            _chunk_grads(dz.div_(temperature).to(h.dtype), h_c, weight, grad_h, grad_w, grad_b, s, e)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None, None)


def _chunk_grads(dz, h_c, weight, grad_h, grad_w, grad_b, s: int, e: int) -> None:
    """One chunk's share of the input gradients from its logits' gradient `dz` (h's dtype); None: not needed."""
    if grad_h is not None:
        torch.mm(dz, weight, out=grad_h[s:e])
    if grad_w is not None:
        _accumulate_mm(grad_w, dz.t(), h_c)
    if grad_b is not None:
        grad_b.add_(dz.sum(dim=0, dtype=torch.float32))


def _accumulate_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc (float32) += a @ b: in place for float32 inputs; a low-precision product is added in float32."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(torch.mm(a, b))
