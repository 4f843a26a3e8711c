"""The copy engine: moves storages between the device and the host pool. The only place that knows about streams.

Two implementations of one small interface:
- `StreamCopies` (CUDA): copies to the host on a D2H stream, copies back (and rebuilds) on an H2D stream; the
  compute stream is captured at `begin()` (never read inside a side-stream context: there `current_stream()`
  is the side stream, and a `wait_stream` on it would be a no-op).
- `InlineCopies` (CPU): the same operations done in place, in order; nothing is ever pending.

A *fence* is a point in a copy stream that the compute stream can wait for (`wait`); None means nothing is
pending. Ordering contract, which the group state machine relies on:
- `copy_out` runs after everything the compute stream has queued so far (the D2H stream waits for it first).
- device memory for copies back comes from `alloc`, i.e. from the compute stream's pool, so the compute stream
  frees it; `copying_back()` orders the copies back after the compute stream's work so far, so no block still
  in use there is overwritten.
- `finish()` (end of a micro-batch) makes the compute stream wait for both directions: after it, host slices
  may be reused and every device buffer freed.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

Fence = Optional[torch.cuda.Event]  # None where nothing is pending


def as_dtype(t_u8: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A flat `dtype` view of a flat uint8 tensor (same bytes)."""
    return t_u8.view(dtype)


def _narrowed(src_u8: torch.Tensor, narrow: Optional[torch.dtype]) -> torch.Tensor:
    """The bytes that travel for a storage: itself, or (float32 holding only `narrow` values) its narrowed copy."""
    return src_u8 if narrow is None else as_dtype(src_u8, torch.float32).to(narrow).view(torch.uint8)


class InlineCopies:
    """CPU: every copy happens when it is asked for; no streams, no fences."""

    def __init__(self, device: torch.device):
        self.device = device

    def begin(self) -> None:
        pass

    def copy_out(self, src: torch.Tensor, dst: torch.Tensor, narrow: Optional[torch.dtype]) -> None:
        dst.copy_(_narrowed(src, narrow))

    def fence_out(self) -> Fence:
        return None

    def wait(self, fence: Fence) -> None:
        pass

    def alloc(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def copying_back(self):
        return contextlib.nullcontext()

    def copy_in(self, src: torch.Tensor, dst: torch.Tensor, narrow: Optional[torch.dtype]) -> None:
        if narrow is None:
            dst.copy_(src)
        else:
            as_dtype(dst, torch.float32).copy_(as_dtype(src, narrow))

    def fence_in(self) -> Fence:
        return None

    def finish(self) -> None:
        pass


class StreamCopies:
    """CUDA: a D2H and an H2D stream next to the compute stream, ordered with events."""

    def __init__(self, device: torch.device):
        self.device = device
        self._d2h = torch.cuda.Stream(device=device)
        self._h2d = torch.cuda.Stream(device=device)
        self._compute = torch.cuda.current_stream(device)  # begin() takes the one of each micro-batch

    def begin(self) -> None:
        self._compute = torch.cuda.current_stream(self.device)

    def copy_out(self, src: torch.Tensor, dst: torch.Tensor, narrow: Optional[torch.dtype]) -> None:
        self._d2h.wait_stream(self._compute)
        with torch.cuda.stream(self._d2h):  # a narrowed temporary lives in the D2H stream's pool
            dst.copy_(_narrowed(src, narrow), non_blocking=True)

    def fence_out(self) -> Fence:
        ev = torch.cuda.Event()
        ev.record(self._d2h)
        return ev

    def wait(self, fence: Fence) -> None:
        if fence is not None:
            self._compute.wait_event(fence)

    def alloc(self, nbytes: int) -> torch.Tensor:
        with torch.cuda.stream(self._compute):  # the compute stream uses and frees it
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    @contextlib.contextmanager
    def copying_back(self):
        self._h2d.wait_stream(self._compute)
        with torch.cuda.stream(self._h2d):
            yield

    def copy_in(self, src: torch.Tensor, dst: torch.Tensor, narrow: Optional[torch.dtype]) -> None:
        if narrow is None:
            dst.copy_(src, non_blocking=True)
        else:  # staging buffer from the H2D stream's pool, widened there
            stage = torch.empty(src.numel(), dtype=torch.uint8, device=self.device)
            stage.copy_(src, non_blocking=True)
            as_dtype(dst, torch.float32).copy_(as_dtype(stage, narrow))

    def fence_in(self) -> Fence:
        ev = torch.cuda.Event()
        ev.record(self._h2d)
        return ev

    def finish(self) -> None:
        if self._compute is not None:
            self._compute.wait_stream(self._d2h)
            self._compute.wait_stream(self._h2d)


def copy_engine(device: torch.device):
    return StreamCopies(device) if device.type == "cuda" else InlineCopies(device)
