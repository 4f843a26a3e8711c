"""Batch shaping for the engines (verl's semantics): micro-batches by count or by a token budget, and the model
inputs of one micro-batch, padded or packed (remove padding).

Rows are `[prompt (left-padded) | response (right-padded)]`; `attention_mask` marks the valid tokens, which are
contiguous in each row, and `position_ids` count them from 0. The head is evaluated only where a valid response
token is predicted: at the position before it, with that token as target. Outputs come back as `[rows, R]`
with zeros where the response is padding.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional

import torch

from rlx.protocol import Batch


# ---- micro-batches -------------------------------------------------------------------------------------------
def seq_lens(batch: Batch) -> torch.Tensor:
    """Valid tokens of each row (what a packed row holds of it)."""
    return batch["attention_mask"].sum(-1)


def balanced_partition(lengths: list[int], max_tokens: int, groups: Optional[int] = None) -> list[list[int]]:
    """Row indices split into as few groups as hold at most `max_tokens` tokens each (a row longer than the
    budget gets a group of its own), or into exactly `groups` groups; balanced either way: longest row first,
    each to the currently lightest group. Each group keeps its rows in their original order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    k = min(len(lengths), groups or max(1, -(-sum(lengths) // max_tokens)))
    while True:
        heap = [(0, g) for g in range(k)]
        out: list[list[int]] = [[] for _ in range(k)]
        fits = True
        for i in order:
            load, g = heapq.heappop(heap)
            if groups is None and load and load + lengths[i] > max_tokens:
                fits = False
                break
            out[g].append(i)
            heapq.heappush(heap, (load + lengths[i], g))
        if fits:
            return [sorted(g) for g in out if g]
        k += 1


def equal_size_partition(lengths: list[int], groups: int) -> list[list[int]]:
    """Row indices split into `groups` groups of equal row count (`len(lengths)` must divide), balanced by tokens:
    longest row first, each to the lightest group that still has room. Each group keeps its rows in order."""
    size, rest = divmod(len(lengths), groups)
    assert rest == 0, f"{len(lengths)} rows do not split into {groups} equal groups"
    out: list[list[int]]
    loads, out = [0] * groups, [[] for _ in range(groups)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        g = min((g for g in range(groups) if len(out[g]) < size), key=lambda g: loads[g])
        out[g].append(i)
        loads[g] += lengths[i]
    return [sorted(g) for g in out]


def micro_batches(batch: Batch, size: Optional[int] = None, max_tokens: Optional[int] = None,
                  agree=None) -> tuple[list[Batch], Optional[torch.Tensor]]:
    """Split `batch` into micro-batches of `size` rows (the last may be smaller) or, with `max_tokens`, by a
    token budget (dynamic batch size). Returns the micro-batches and the row permutation that was applied
    (None when rows kept their order); `restore_order` puts per-row outputs back.

    `agree(n) -> int` (the max of n over the data-parallel ranks) makes every rank use the same number of
    micro-batches, as FSDP's collectives need."""
    if max_tokens is None:
        assert size is not None and size > 0, size
        return batch.split(size), None
    lengths = seq_lens(batch).tolist()
    groups = balanced_partition(lengths, max_tokens)
    if agree is not None:  # as many as the rank that needs most; a rank that needs fewer splits finer
        k = agree(len(groups))
        if k != len(groups):
            groups = balanced_partition(lengths, max_tokens, groups=k)
    perm = torch.tensor([i for g in groups for i in g], dtype=torch.long)
    return [batch.index(g) for g in groups], perm


def restore_order(out: Batch, perm: Optional[torch.Tensor]) -> Batch:
    if perm is None:
        return out
    return out.index(torch.argsort(perm))


# ---- model inputs --------------------------------------------------------------------------------------------
@dataclass
class TokenInputs:
    """One micro-batch as the model sees it, and where its head outputs go."""

    kwargs: dict
    """Keyword arguments of the engine model's forward (see `heads.apply_token_head`)."""
    rows: torch.Tensor
    """Row of each scored token."""
    cols: torch.Tensor
    """Response column of each scored token."""
    shape: tuple
    """`[rows, R]`: the response layout the outputs are scattered into."""

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """`[N]` head outputs -> `[rows, R]` (zeros at response padding); differentiable."""
        out = values.new_zeros(self.shape)
        return out.index_put((self.rows, self.cols), values)


def token_inputs(mb: Batch, device: torch.device, remove_padding: bool,
                 sp: Optional[tuple[int, int]] = None) -> TokenInputs:
    """The model inputs of `mb`, padded or packed; with `sp=(rank, size)` (Ulysses, packed only) this rank's
    slice of the packed row (`ulysses.shard_packed`)."""
    responses, resp_mask = mb["responses"], mb["response_mask"]
    seq, resp_len = mb["input_ids"].shape[1], responses.shape[1]
    rows, cols = resp_mask.nonzero(as_tuple=True)
    pred = cols + (seq - resp_len - 1)  # column that predicts response token `cols`
    return _inputs_at(mb, rows, pred, cols, responses[rows, cols], (len(responses), resp_len), device, remove_padding,
                      sp)


def last_token_inputs(mb: Batch, device: torch.device, remove_padding: bool) -> TokenInputs:
    """The model inputs of `mb` (`input_ids`, `attention_mask`, `position_ids`: any padding, left or right) scored
    at each row's last valid token (the reward model's read-out); outputs scatter to `[rows, 1]`."""
    mask = mb["attention_mask"]
    n_rows, seq = mask.shape
    cols = torch.arange(seq).expand(n_rows, -1)
    last = torch.where(mask.bool(), cols, -1).max(dim=1).values
    assert bool((last >= 0).all()), "every row holds at least one token"
    rows = torch.arange(n_rows)
    return _inputs_at(mb, rows, last, torch.zeros_like(rows), None, (n_rows, 1), device, remove_padding, None)


def _inputs_at(mb: Batch, rows, pred, cols, targets, shape, device, remove_padding, sp) -> TokenInputs:
    """Model inputs that score the tokens at (`rows`, column `pred` of `input_ids`); outputs go to (`rows`, `cols`)
    of a `shape` tensor."""
    input_ids, mask, pos = mb["input_ids"], mb["attention_mask"], mb["position_ids"]
    n_rows, seq = input_ids.shape
    if remove_padding:
        valid = mask.bool()
        flat_pos = valid.reshape(-1).long().cumsum(0) - 1  # packed position of every valid flat position
        index = flat_pos[rows * seq + pred]
        lens = valid.sum(-1)
        cu = torch.zeros(n_rows + 1, dtype=torch.int32)
        cu[1:] = lens.cumsum(0)
        kwargs = dict(input_ids=input_ids[valid].unsqueeze(0), position_ids=pos[valid].unsqueeze(0),
                      attention_mask=None, cu_seq_lens=cu[torch.cat([torch.tensor([True]), lens > 0])])
    else:
        index = rows * seq + pred
        kwargs = dict(input_ids=input_ids, position_ids=pos, attention_mask=mask)
    kwargs.update(index=index, targets=targets)
    if sp is not None and sp[1] > 1:
        from rlx.engine.ulysses import shard_packed

        assert remove_padding, "sequence parallelism shards the packed row (use_remove_padding=True)"
        kwargs = shard_packed(kwargs["input_ids"], kwargs["position_ids"], kwargs["cu_seq_lens"], index, targets,
                              rank=sp[0], sp=sp[1])
    kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return TokenInputs(kwargs, rows.to(device), cols.to(device), shape)
