"""A host-memory pool for offloaded activations: a bump allocator over a few large (pinned) chunks.

One micro-batch allocates its slices in forward order; `reset()` at the end of the micro-batch hands
everything back. Chunks are never freed, so after the largest micro-batch has been seen the pool does no
more host allocation (no per-tensor cudaHostAlloc, no growth over steps).
"""
from __future__ import annotations

from typing import List, Optional

import torch

_ALIGN = 512
_MiB = 1 << 20
_GiB = 1 << 30


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class HostPool:
    def __init__(self, chunk_bytes: int, pin_memory: bool, max_bytes: Optional[int] = None):
        self.chunk_bytes = max(int(chunk_bytes), _MiB)
        self.pin_memory = bool(pin_memory)
        self.max_bytes = max_bytes
        self.chunks: List[torch.Tensor] = []
        self.n_chunk_allocs = 0
        self._ci = 0
        self._off = 0
        self.used = 0
        self.peak_used = 0

    @property
    def capacity(self) -> int:
        return sum(c.numel() for c in self.chunks)

    def allocate(self, nbytes: int) -> Optional[torch.Tensor]:
        """A uint8 host tensor of `nbytes`, or None when it does not fit under `max_bytes`.

        The bound bounds, it never disables: a chunk is cut down to what is left under it (so a bound below
        `chunk_bytes` still holds that much), and a request that does not fit leaves the bump pointer where it
        was, so later, smaller requests still use what remains of the current chunk."""
        n = _round_up(max(int(nbytes), 1), _ALIGN)
        for ci in range(self._ci, len(self.chunks)):
            off = self._off if ci == self._ci else 0
            c = self.chunks[ci]
            if off + n <= c.numel():
                self._ci, self._off = ci, off + n
                self._account(n)
                return c[off:off + nbytes]
        size = max(self.chunk_bytes, _round_up(n, 2 * _MiB))
        if self.max_bytes is not None:
            size = min(size, self.max_bytes - self.capacity)
            if size < n:
                return None
        chunk = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin_memory)
        self.n_chunk_allocs += 1
        self.chunks.append(chunk)
        self._ci, self._off = len(self.chunks) - 1, n
        self._account(n)
        return chunk[:nbytes]

    def reserve(self, nbytes: int, piece: int = 0) -> int:
        """Grow the pool now to at least `nbytes` (under `max_bytes`), so that the micro-batch that needs them
        does no host allocation. Every request must fit in one chunk, so with `piece` (the bytes of the requests
        to come, e.g. one layer input) the chunks hold whole pieces, about 1 GiB each (one page-locking call per
        chunk; a failure leaves what was pinned before). Returns the bytes added."""
        want = _round_up(int(nbytes), 2 * _MiB) - self.capacity
        if self.max_bytes is not None:
            want = min(want, self.max_bytes - self.capacity)
        piece = _round_up(max(int(piece), 1), _ALIGN)
        chunk = piece * max(1, max(_GiB, self.chunk_bytes) // piece)
        added = 0
        while want - added > 0:
            size = min(chunk, want - added)
            self.chunks.append(torch.empty(size, dtype=torch.uint8, pin_memory=self.pin_memory))
            self.n_chunk_allocs += 1
            added += size
        return added

    def _account(self, n: int) -> None:
        self.used += n
        self.peak_used = max(self.peak_used, self.used)

    def reset(self) -> None:
        """Every slice handed out since the last reset is free again (callers order the streams)."""
        self._ci = 0
        self._off = 0
        self.used = 0
