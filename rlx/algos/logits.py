"""Per-token quantities of a categorical distribution given as logits, computed a chunk of rows at a time so that the
float32 softmax of a [tokens, vocab] tensor is never held at once: log-probabilities, entropy, sum of squared
probabilities."""
from __future__ import annotations

from typing import Optional

import torch

# Rows of logits processed at once by the log-prob / entropy helpers (bounds peak fp32 memory).
_LOGITS_ROW_CHUNK = 1024


def _rowwise(fn, logits: torch.Tensor, *extra: torch.Tensor, chunk: int = _LOGITS_ROW_CHUNK) -> torch.Tensor:
    """Apply ``fn(rows_fp32, *extra_rows) -> [n]`` to ``logits`` flattened to ``[N, V]`` in chunks of ``chunk``
    rows."""
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    flat_extra = [e.reshape(-1) for e in extra]
    n = flat.shape[0]
    if n == 0:  # still a function of `logits`: a rank with no token (a Ulysses slice) joins the backward
        return flat.sum(-1).to(torch.float32 if flat.dtype in (torch.float16, torch.bfloat16) else flat.dtype) \
            .reshape(lead)
    outs = []
    for s in range(0, n, chunk):
        rows = flat[s:s + chunk]
        if rows.dtype in (torch.float16, torch.bfloat16):
            rows = rows.float()
        outs.append(fn(rows, *[e[s:s + chunk] for e in flat_extra]))
    return torch.cat(outs).reshape(lead)


def entropy_from_logits(logits: torch.Tensor, chunk_size: Optional[int] = None) -> torch.Tensor:
    """Entropy of the categorical distribution over the last dim: ``logsumexp(z) - sum(softmax(z) * z)``.

    Shape ``[..., V] -> [...]``, computed ``chunk_size`` rows at a time (default 1024; verl's
    ``entropy_from_logits_with_chunking`` with its ``entropy_from_logits_chunk_size``), so the transient float32
    softmax is ``[chunk_size, V]``. Half-precision logits are upcast to fp32 chunk by chunk (the result is fp32).
    """
    def _ent(z: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)

    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"entropy chunk_size={chunk_size}: must be a positive number of rows")
    return _rowwise(_ent, logits, chunk=chunk_size or _LOGITS_ROW_CHUNK)


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``sum_v softmax(z)_v^2`` over the last dim, as ``exp(logsumexp(2 z) - 2 logsumexp(z))`` (what the optimal token
    baseline reads; ``actor.calculate_sum_pi_squared``). Shape ``[..., V] -> [...]``, fp32 for half inputs."""
    def _spsq(z: torch.Tensor) -> torch.Tensor:
        return torch.exp(torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1))

    return _rowwise(_spsq, logits)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``labels`` under ``logits``: ``z[label] - logsumexp(z)``.

    Shapes ``[..., V]`` and ``[...]`` -> ``[...]``. Memory-friendly: never materialises a full
    log-softmax; rows are processed in chunks and half-precision logits are upcast per chunk (the
    result is fp32 for fp16/bf16 inputs).
    """
    def _lp(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return z.gather(-1, y.long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)

    return _rowwise(_lp, logits, labels)
