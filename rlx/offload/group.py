"""A group (the saved tensors of one layer call) and its states: the offload's state machine.

    event (method)       from state              to state
    forward_ended        PACKING                 COPYING   (storages travel to the host)
                                                 KEPT      (nothing travels: a kept layer, or nothing eligible)
    copies_due           COPYING                 OFFLOADED (waits for its copies, drops the device copies)
    needed               COPYING                 RESIDENT  (the device copies are still there: use them)
                         OFFLOADED               RESIDENT  (copies back queued, storage by storage)
    backward_done        RESIDENT                OFFLOADED (device copies dropped; host copies stay)
    micro_batch_ended    any                     CLOSED    (everything released; an unpack is an error)

Any other (event, state) pair leaves the group as it is: `needed` on a RESIDENT group (prefetched, then
reached by backward), `copies_due` on a group that backward already brought back, every event but
`micro_batch_ended` on a KEPT group. `TRANSITIONS` is this table; `Group._move` refuses anything else.

One `Entry` per saved *storage*: `src` (the device storage, until its copy to the host is done), `host` (its
slice of the pool), `dev` (the device copy in backward). Autograd holds a `Packed` per saved tensor: the
group, the storage key and the exact view (dtype/shape/stride/offset), rebuilt with `set_()` on whichever
copy is current. Every device/host operation goes through the copy engine (`copies.py`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from .copies import Fence
from .exact import narrow_dtype, rebuild, recipe
from .pool import HostPool


class GroupState(enum.Enum):
    PACKING = "packing"  # the layer's forward runs: saved storages join the group, their copies out start
    COPYING = "copying"  # forward done, copies to the host in flight; the device copies are still held
    OFFLOADED = "offloaded"  # on the host only (storages that had to stay on the device excepted)
    RESIDENT = "resident"  # device copies present (copies back may still be in flight: per-storage fences)
    KEPT = "kept"  # nothing of it travels; no event but the end of the micro-batch concerns it
    CLOSED = "closed"  # the micro-batch is over: everything released


S = GroupState
TRANSITIONS: Dict[str, Dict[GroupState, Tuple[GroupState, ...]]] = {
    "forward_ended": {S.PACKING: (S.COPYING, S.KEPT)},
    "copies_due": {S.COPYING: (S.OFFLOADED,)},
    "needed": {S.COPYING: (S.RESIDENT,), S.OFFLOADED: (S.RESIDENT,)},
    "backward_done": {S.RESIDENT: (S.OFFLOADED,)},
    "micro_batch_ended": {s: (S.CLOSED,) for s in GroupState},
}


@dataclass
class OffloadStats:
    """What one micro-batch did (bytes are device bytes of whole storages)."""

    n_groups: int = 0
    offloaded_bytes: int = 0  # storages that left the device (copied or rebuilt)
    moved_bytes: int = 0  # bytes copied each way (a narrowed float32 storage counts half)
    kept_bytes: int = 0  # eligible storages that stayed (pool full, or written after they were saved)
    rebuilt_bytes: int = 0  # storages recomputed elementwise on the way back instead of copied


class Entry:
    """One storage of a group: `src` (device, until its copy is done), `host` slice, `dev` (reloaded)."""

    __slots__ = ("src", "host", "dev", "nbytes", "keep", "narrow", "t", "ver", "fence", "recipe")

    def __init__(self, src: torch.Tensor, nbytes: int):
        self.src: Optional[torch.Tensor] = src
        self.host: Optional[torch.Tensor] = None
        self.dev: Optional[torch.Tensor] = None
        self.nbytes = nbytes
        self.keep = False  # the pool was full (or the storage changed after its copy): stays on the device
        self.narrow = None  # float32 storage that travels as this narrower dtype (exact, see exact.py)
        self.t: Optional[torch.Tensor] = None  # first saved tensor and its version, until the layer ends
        self.ver = 0
        self.fence: Fence = None  # the copy back of this storage, until the compute stream has waited for it
        self.recipe = None  # (op, [(source entry, its saved view)], dtype, shape): rebuilt, not copied


class Packed:
    """What autograd holds instead of an offloaded tensor: the group, the storage key and the exact view."""

    __slots__ = ("group", "key", "dtype", "shape", "stride", "offset")

    def __init__(self, group, key, t: torch.Tensor):
        self.group = group
        self.key = key
        self.dtype = t.dtype
        self.shape = t.shape
        self.stride = t.stride()
        self.offset = t.storage_offset()


def _u8_view(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


def view_of(base: torch.Tensor, p: Packed) -> torch.Tensor:
    """The exact saved view `p` (dtype/shape/stride/offset) over the storage of `base` (a device uint8 tensor)."""
    return torch.empty(0, dtype=p.dtype, device=base.device).set_(base.untyped_storage(), p.offset, p.shape, p.stride)


_RELEASED_ERROR = (
    "activation offload: a saved activation was released before its backward. Run the forward "
    "and loss.backward() of a micro-batch inside one offloader.activate() and backward once "
    "(retain_graph / a second backward is not supported with model.enable_activation_offload).")


class Group:
    """The saved tensors of one layer call; see the module docstring for its states and events."""

    def __init__(self, seq: int, layer_idx: int, keep_ptrs: set, prev: Optional["Group"], copies, pool: HostPool,
                 stats: OffloadStats, rebuild_pointwise: bool):
        self.seq = seq
        self.layer_idx = layer_idx
        self.keep_ptrs = keep_ptrs  # storages that stay on the device (parameters, inputs needing no grad)
        self.prev = prev  # the group called before this one (backward reaches it next)
        self.state = GroupState.PACKING
        self.entries: Dict[Tuple[int, int], Entry] = {}
        self.produced: Dict[Tuple[int, int], tuple] = {}  # while packing: see exact.recipe
        self.copied: Fence = None  # all copies to the host of this group
        self.loaded: Fence = None  # all copies back of its last load
        self._copies = copies
        self._pool = pool
        self._stats = stats
        self._rebuild = rebuild_pointwise

    def _move(self, event: str, to: GroupState) -> None:
        assert to in TRANSITIONS[event].get(self.state, ()), (event, self.state, to)
        self.state = to

    def _can(self, event: str) -> bool:
        return self.state in TRANSITIONS[event]

    # ------------------------------------------------------------------ events
    def pack(self, t: torch.Tensor):
        """A tensor saved while the layer runs (already found eligible): join its storage, start its copy out."""
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes())
        if key not in self.entries:
            e = Entry(_u8_view(st, t.device), st.nbytes())
            e.recipe = recipe(self.produced, t, e.nbytes) if self._rebuild else None
            self.entries[key] = e
            e.t, e.ver = t, t._version
            if e.recipe is None:
                e.narrow = narrow_dtype(t, e.nbytes)
                self._copy_out(e)
            else:
                self._stats.offloaded_bytes += e.nbytes
                self._stats.rebuilt_bytes += e.nbytes
        packed = Packed(self, key, t)
        if t.grad_fn is not None and self._rebuild:
            self.produced[(id(t.grad_fn), t.output_nr)] = (t.grad_fn, self.entries[key], packed)
        return packed

    def forward_ended(self) -> None:
        """The layer returned. Storages written after they were packed are copied again (or stay, if they were
        travelling narrowed or are rebuilt); the group's copies out get one fence."""
        if not self._can("forward_ended"):
            return
        if not self.entries:
            self._move("forward_ended", GroupState.KEPT)
            return
        changed = {id(e) for e in self.entries.values() if e.t is not None and e.t._version != e.ver}
        for e in self.entries.values():
            if e.recipe is not None and not e.keep and (id(e) in changed or any(
                    id(s) in changed for s, _ in e.recipe[1])):
                e.keep, e.recipe = True, None  # its inputs (or itself) changed after forward: keep it
                self._stats.kept_bytes += e.nbytes
                self._stats.rebuilt_bytes -= e.nbytes
                self._stats.offloaded_bytes -= e.nbytes
        for e in self.entries.values():
            if id(e) in changed and not e.keep:
                # written in place after it was packed (autograd would normally refuse this): copy again,
                # or keep it on the device if it was travelling narrowed
                if e.narrow is not None:
                    e.keep = True
                    self._stats.kept_bytes += e.nbytes
                else:
                    self._copies.copy_out(e.src, e.host, None)
            e.t = None
        self.produced = {}
        self.copied = self._copies.fence_out()
        self._move("forward_ended", GroupState.COPYING)

    def copies_due(self) -> None:
        """Its copies out must be complete now (at most two groups resident in forward, or the end of forward):
        the compute stream waits for them and the device copies are dropped."""
        if not self._can("copies_due"):
            return
        self._copies.wait(self.copied)
        for e in self.entries.values():
            if e.keep:
                e.dev = e.src
            e.src = None
        self._move("copies_due", GroupState.OFFLOADED)

    def needed(self) -> None:
        """Backward reaches the layer (or will soon: prefetch, or an unpack found it offloaded)."""
        if not self._can("needed"):
            return
        if self.state is GroupState.COPYING:  # copies still in flight: the device copies are still here
            self._copies.wait(self.copied)  # ordered before the device copies may be freed
            for e in self.entries.values():
                e.dev, e.src = e.src, None
            self._move("needed", GroupState.RESIDENT)
            return
        todo = [e for e in reversed(list(self.entries.values())) if e.dev is None]  # backward needs the last first
        done = {id(e) for e in self.entries.values() if e.dev is not None}  # kept on the device: nothing to do
        for e in todo:  # all allocations first, then one wait of the copy stream for the compute stream
            e.dev = self._copies.alloc(e.nbytes)
        with self._copies.copying_back():
            for e in todo:
                self._bring_back(e, done)
            if todo:
                self.loaded = self._copies.fence_in()
        self._move("needed", GroupState.RESIDENT)

    def backward_done(self) -> None:
        """The gradients of the layer's inputs are complete: its device copies are dropped."""
        if not self._can("backward_done"):
            return
        if any(e.fence is not None for e in self.entries.values()):
            self._copies.wait(self.loaded)  # a storage never unpacked: its copy must end before the free
        for e in self.entries.values():
            e.fence = None
            if not e.keep:
                e.dev = None
        self._move("backward_done", GroupState.OFFLOADED)

    def micro_batch_ended(self) -> None:
        """Everything is released (the copy engine has finished); an unpack after this is an error."""
        self.prev = None
        self.entries, self.produced = {}, {}
        self._move("micro_batch_ended", GroupState.CLOSED)

    # ------------------------------------------------------------------ unpack
    def unpack(self, p: Packed) -> torch.Tensor:
        if self.state is GroupState.CLOSED:
            raise RuntimeError(_RELEASED_ERROR)
        e = self.entries[p.key]
        if self.state is GroupState.OFFLOADED and not e.keep:
            self.needed()  # not brought back by the hooks: load it on the spot
        if e.dev is not None:
            if e.fence is not None:
                self._copies.wait(e.fence)
                e.fence = None
            return view_of(e.dev, p)
        assert e.src is not None  # neither reloaded nor dropped
        return view_of(e.src, p)  # still packing or copying: the device copy is intact

    # ------------------------------------------------------------------ copies
    def _copy_out(self, e: Entry) -> None:
        """Start the copy of one storage to the host (after what the compute stream has queued)."""
        nb = e.nbytes // 2 if e.narrow is not None else e.nbytes
        e.host = self._pool.allocate(nb)
        if e.host is None:
            e.keep, e.narrow = True, None
            self._stats.kept_bytes += e.nbytes
            return
        self._stats.offloaded_bytes += e.nbytes
        self._stats.moved_bytes += nb
        self._copies.copy_out(e.src, e.host, e.narrow)

    def _bring_back(self, e: Entry, done: set) -> None:
        """Fill `e.dev` (allocated) from its host copy, or rebuild it from its sources (brought back first)."""
        if id(e) in done:
            return
        done.add(id(e))
        if e.recipe is not None:
            op, srcs, dtype, shape = e.recipe
            args: List[torch.Tensor] = []
            for s, view in srcs:
                self._bring_back(s, done)
                args.append(view_of(s.dev, view))
            out = torch.empty(0, dtype=dtype, device=e.dev.device).set_(e.dev.untyped_storage(), 0, shape)
            rebuild(op, args, out)
        else:
            self._copies.copy_in(e.host, e.dev, e.narrow)
        e.fence = self._copies.fence_in()
