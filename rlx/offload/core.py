"""Layer-grouped activation offload: groups, saved-tensor hooks, streams and the per-layer wrapper.

Each decoder-layer call inside `activate()` opens a group. While the layer runs, a saved-tensors hook pair
sends every eligible saved tensor to that group; one copy is made per *storage* and every saved view is
restored with its exact dtype/shape/stride/offset (never de-duplicated by data pointer alone). When the
layer's forward ends, the group is copied to host memory on a D2H stream while the next layer computes; at
the end of the next layer the compute stream waits for that copy and the device copies are dropped, so at
most two groups are resident. In backward, an identity function on the layer's outputs marks "layer i's
backward starts": group i is made resident and group i-1 is prefetched on an H2D stream; an identity on the
layer's inputs marks "layer i's backward is done" and group i's device copies are dropped. Groups are keyed
by call order, not layer index, so a skipped (or repeated) layer is handled. Whatever the hooks see, an
unpack always works: a group not yet resident is loaded synchronously from its host copy, which lives until
the end of the micro-batch.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ActivationOffloadConfig
from .pool import HostPool

# group states
_BUILDING, _COPYING, _ON_HOST, _LOADING, _LOADED, _RELEASED = range(6)


class _Entry:
    """One storage of a group: `src` (device, until its copy is done), `host` slice, `dev` (reloaded)."""

    __slots__ = ("src", "host", "dev", "nbytes", "keep")

    def __init__(self, src: torch.Tensor, nbytes: int):
        self.src: Optional[torch.Tensor] = src
        self.host: Optional[torch.Tensor] = None
        self.dev: Optional[torch.Tensor] = None
        self.nbytes = nbytes
        self.keep = False  # the pool was full: stays on the device


class _Group:
    __slots__ = ("seq", "layer_idx", "offload", "keep_ptrs", "entries", "prev", "state",
                 "d2h_event", "h2d_event", "waited", "valid", "n_packed")

    def __init__(self, seq: int, layer_idx: int, offload: bool, keep_ptrs: set, prev: Optional["_Group"]):
        self.seq = seq
        self.layer_idx = layer_idx
        self.offload = offload
        self.keep_ptrs = keep_ptrs
        self.entries: Dict[Tuple[int, int], _Entry] = {}
        self.prev = prev
        self.state = _BUILDING
        self.d2h_event = None
        self.h2d_event = None
        self.waited = False
        self.valid = True
        self.n_packed = 0


class _Packed:
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


def _tensors_in(obj) -> List[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors_in(o)]
    return []


class _Boundary(torch.autograd.Function):
    """Identity on a layer's tensors; its backward tells the offloader where backward has got to."""

    @staticmethod
    def forward(ctx, offloader, group, is_output, *tensors):
        ctx.offloader, ctx.group, ctx.is_output = offloader, group, is_output  # only inputs are marked now
        ctx.set_materialize_grads(False)
        return tensors if len(tensors) > 1 else tensors[0]

    @staticmethod
    def backward(ctx, *grads):
        if ctx.is_output:
            ctx.offloader._on_backward_start(ctx.group)
        else:
            ctx.offloader._on_backward_end(ctx.group)
        return (None, None, None) + grads


def _mark(offloader, group, is_output: bool, tree):
    """Apply `_Boundary` to the grad-requiring tensors found at the top level of `tree` (tensor/tuple/list/dict)."""
    if isinstance(tree, torch.Tensor):
        items, rebuild = [tree], lambda xs: xs[0]
    elif isinstance(tree, (tuple, list)):
        items, rebuild = list(tree), lambda xs: type(tree)(xs) if isinstance(tree, list) else tuple(xs)
    elif isinstance(tree, dict):
        keys = list(tree)
        items, rebuild = [tree[k] for k in keys], lambda xs: {**tree, **dict(zip(keys, xs))}
    else:
        return tree, False
    idx = [i for i, x in enumerate(items) if isinstance(x, torch.Tensor) and x.requires_grad]
    if not idx:
        return tree, False
    outs = _Boundary.apply(offloader, group, is_output, *[items[i] for i in idx])
    outs = outs if isinstance(outs, tuple) else (outs,)
    for i, o in zip(idx, outs):
        items[i] = o
    return rebuild(items), True


class ActivationOffloader:
    """Returned by `apply_activation_offload`; see the module docstring and docs/offload.md."""

    def __init__(self, layers: List[nn.Module], owners: List[List[nn.Module]], cfg: ActivationOffloadConfig,
                 checkpointing: bool, device: torch.device, layer_class: str, head: List[nn.Module] = (),
                 head_owners: List[List[nn.Module]] = ()):
        self.cfg = cfg
        self.layers = list(layers)  # decoder layers
        self.head = list(head)  # final norm / output projection, when cfg.offload_head
        self.owners = list(owners) + list(head_owners)
        n = len(self.layers)
        modules = self.layers + self.head
        # per patched module: offload its group? checkpoint it? (never the output projection: too costly)
        self._offload = [i < n - max(cfg.keep_last_layers, 0) or i >= n for i in range(len(modules))]
        self._ckpt = [checkpointing and (i < n or not isinstance(m, nn.Linear)) for i, m in enumerate(modules)]
        self.checkpointing = checkpointing
        self.device = device
        self.layer_class = layer_class
        self.cuda = device.type == "cuda"
        self.pool = HostPool(cfg.pool_chunk_bytes, cfg.pin_memory and self.cuda, cfg.max_pool_bytes)
        if self.cuda:
            self._d2h = torch.cuda.Stream(device=device)
            self._h2d = torch.cuda.Stream(device=device)
        self._compute = None  # captured at activate(), outside any side-stream context
        self._active = False
        self._groups: List[_Group] = []
        self._inflight: List[_Group] = []
        self._callback_queued = False
        self._offloaded_bytes = 0
        self._last: Dict[str, int] = {"offloaded_bytes": 0, "n_groups": 0, "kept_bytes": 0}
        self._kept_bytes = 0
        self._originals = []
        for i, m in enumerate(modules):
            self._patch(i, m)

    # ------------------------------------------------------------------ public API
    @contextlib.contextmanager
    def activate(self):
        """Offload (and, if enabled, checkpoint) the decoder layers for one micro-batch's forward+backward."""
        if self._active:
            raise RuntimeError("ActivationOffloader.activate() does not nest")
        for layer in self.layers:
            if getattr(layer, "gradient_checkpointing", False) and layer.training:
                raise RuntimeError(
                    "HF gradient checkpointing is enabled on a decoder layer while activation offload is on "
                    "(model.enable_activation_offload): both need the saved-tensor hooks. Disable HF "
                    "checkpointing and pass enable_gradient_checkpointing=True to apply_activation_offload.")
        self._compute = torch.cuda.current_stream(self.device) if self.cuda else None
        self._active = True
        try:
            yield self
        finally:
            self._active = False
            self._finalize()

    def describe(self) -> str:
        s = self.stats()
        return (f"activation offload: {s['n_layers']} x {self.layer_class}, checkpointing="
                f"{'on' if self.checkpointing else 'off'}, keep_last_layers={self.cfg.keep_last_layers}, "
                f"offload_head={self.cfg.offload_head}, min_tensor_bytes={self.cfg.min_tensor_bytes}, device={self.device}, "
                f"{'pinned ' if self.pool.pin_memory else ''}pool={s['pool_bytes']} bytes in "
                f"{s['pool_chunks']} chunks, last micro-batch: {s['n_groups']} groups, "
                f"{s['offloaded_bytes_last_step']} bytes offloaded")

    def stats(self) -> dict:
        return {
            "n_layers": len(self.layers),
            "n_groups": self._last["n_groups"],
            "pool_bytes": self.pool.capacity,
            "pool_chunks": len(self.pool.chunks),
            "pool_chunk_allocs": self.pool.n_chunk_allocs,
            "pool_peak_used_bytes": self.pool.peak_used,
            "offloaded_bytes_last_step": self._last["offloaded_bytes"],
            "kept_bytes_last_step": self._last["kept_bytes"],
        }

    def remove(self) -> None:
        """Undo the layer patching (the model behaves as before apply_activation_offload)."""
        for layer, had, orig in self._originals:
            if had:
                layer.forward = orig
            else:
                del layer.forward
        self._originals = []

    # ------------------------------------------------------------------ layer wrapper
    def _patch(self, idx: int, layer: nn.Module) -> None:
        had = "forward" in layer.__dict__
        orig = layer.forward
        self._originals.append((layer, had, layer.__dict__.get("forward")))

        def forward(*args, **kwargs):
            if not self._active or not torch.is_grad_enabled():
                return orig(*args, **kwargs)
            return self._run_layer(idx, orig, args, kwargs)

        layer.forward = forward

    def _keep_ptrs(self, idx: int, args, kwargs) -> set:
        ptrs = set()
        for m in self.owners[idx]:
            for t in list(m.parameters()) + list(m.buffers()):
                try:
                    ptrs.add(t.untyped_storage().data_ptr())
                except (RuntimeError, NotImplementedError):
                    pass
        for t in _tensors_in((args, kwargs)):
            if not t.requires_grad and type(t) is torch.Tensor:
                ptrs.add(t.untyped_storage().data_ptr())  # shared inputs (rotary cos/sin, masks)
        return ptrs

    def _run_layer(self, idx: int, orig, args, kwargs):
        if not args and "hidden_states" in kwargs:  # positional, so checkpoint saves (and we offload) it
            kwargs = dict(kwargs)
            args = (kwargs.pop("hidden_states"),)
        offload = self._offload[idx]
        prev = self._groups[-1] if self._groups else None
        g = _Group(len(self._groups), idx, offload, self._keep_ptrs(idx, args, kwargs), prev)
        self._groups.append(g)
        args, _ = _mark(self, g, False, args)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(g, t), self._unpack):
            if self._ckpt[idx]:
                out = checkpoint(orig, *args, use_reentrant=False, **kwargs)
            else:
                out = orig(*args, **kwargs)
        # backward of this layer starts when the gradient of its output arrives: a tensor hook, so the output
        # stays the layer's own tensor (not a view: FSDP2 warns about views, in-place ops on them lose hooks)
        for t in _tensors_in(out if isinstance(out, (tuple, list)) else [out])[:8]:
            if t.requires_grad:
                t.register_hook(lambda grad, g=g: self._on_backward_start(g))
        self._end_forward(g)
        return out

    # ------------------------------------------------------------------ hooks
    def _eligible(self, g: _Group, t: torch.Tensor) -> bool:
        if not g.offload or type(t) is not torch.Tensor or t.layout != torch.strided:
            return False
        if t.device != self.device or t.is_quantized or t.is_conj() or t.is_neg():
            return False
        if t.requires_grad and t.is_leaf:  # parameters and user leaves
            return False
        st = t.untyped_storage()
        nb = st.nbytes()
        return nb > 0 and nb >= self.cfg.min_tensor_bytes and st.data_ptr() not in g.keep_ptrs

    def _pack(self, g: _Group, t: torch.Tensor):
        if g.state != _BUILDING or not self._eligible(g, t):
            return t
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes())
        if key not in g.entries:
            g.entries[key] = _Entry(_u8_view(st, t.device), st.nbytes())
        g.n_packed += 1
        return _Packed(g, key, t)

    def _unpack(self, p):
        if isinstance(p, torch.Tensor):
            return p
        g = p.group
        if not g.valid:
            raise RuntimeError(
                "activation offload: a saved activation was released before its backward. Run the forward "
                "and loss.backward() of a micro-batch inside one offloader.activate() and backward once "
                "(retain_graph / a second backward is not supported with model.enable_activation_offload).")
        e = g.entries[p.key]
        if e.dev is not None:
            self._wait(g)
            base = e.dev
        elif e.src is not None:  # still being built or copied: the device copy is intact
            base = e.src
        else:
            self._load(g)
            self._wait(g)
            base = e.dev
        return torch.empty(0, dtype=p.dtype, device=self.device).set_(
            base.untyped_storage(), p.offset, p.shape, p.stride)

    # ------------------------------------------------------------------ forward side
    def _end_forward(self, g: _Group) -> None:
        if g.state != _BUILDING:
            return
        if g.offload and g.entries:
            self._copy_out(g)
        else:
            for e in g.entries.values():
                e.dev, e.src, e.keep = e.src, None, True
            g.state = _LOADED
            g.waited = True
        # at most two groups resident: the one just finished (copying) and the next one being built
        last = g.layer_idx == len(self._offload) - 1
        keep = [] if last else [g]
        for h in self._inflight:
            if h is not g:
                self._drop_src(h)
        if last and g.state == _COPYING:
            self._drop_src(g)
        self._inflight = [h for h in keep if h.state == _COPYING]

    def _copy_out(self, g: _Group) -> None:
        for e in g.entries.values():
            e.host = self.pool.allocate(e.nbytes)
            if e.host is None:
                e.keep = True
                self._kept_bytes += e.nbytes
            else:
                self._offloaded_bytes += e.nbytes
        if self.cuda:
            with torch.cuda.stream(self._d2h):
                self._d2h.wait_stream(self._compute)
                for e in g.entries.values():
                    if not e.keep:
                        e.host.copy_(e.src, non_blocking=True)
                g.d2h_event = torch.cuda.Event()
                g.d2h_event.record(self._d2h)
        else:
            for e in g.entries.values():
                if not e.keep:
                    e.host.copy_(e.src)
        g.state = _COPYING

    def _drop_src(self, g: _Group) -> None:
        if g.state != _COPYING:
            return
        if self.cuda:
            self._compute.wait_event(g.d2h_event)
        for e in g.entries.values():
            if e.keep:
                e.dev = e.src
            e.src = None
        g.state = _ON_HOST

    # ------------------------------------------------------------------ backward side
    def _load(self, g: _Group) -> None:
        if g.state == _COPYING:  # copy still in flight: its device copy is still here, use it
            if self.cuda:
                self._compute.wait_event(g.d2h_event)  # keep ordering before the device copy is freed
            for e in g.entries.values():
                e.dev, e.src = e.src, None
            g.state, g.waited = _LOADED, True
            return
        if g.state not in (_ON_HOST, _RELEASED):
            return
        todo = [e for e in g.entries.values() if e.dev is None]
        if self.cuda:
            with torch.cuda.stream(self._compute):  # allocate on the compute stream (it frees them)
                for e in todo:
                    e.dev = torch.empty(e.nbytes, dtype=torch.uint8, device=self.device)
            with torch.cuda.stream(self._h2d):
                self._h2d.wait_stream(self._compute)
                for e in todo:
                    e.dev.copy_(e.host, non_blocking=True)
                g.h2d_event = torch.cuda.Event()
                g.h2d_event.record(self._h2d)
            g.waited = False
        else:
            for e in todo:
                e.dev = torch.empty(e.nbytes, dtype=torch.uint8).copy_(e.host)
            g.waited = True
        g.state = _LOADING

    def _wait(self, g: _Group) -> None:
        if not g.waited:
            if self.cuda and g.h2d_event is not None:
                self._compute.wait_event(g.h2d_event)
            g.waited = True
        if g.state == _LOADING:
            g.state = _LOADED

    def _on_backward_start(self, g: _Group) -> None:
        if not g.valid:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
        self._load(g)
        self._wait(g)
        h = g.prev
        for _ in range(max(self.cfg.prefetch_layers, 0)):
            if h is None:
                break
            if h.offload:
                self._load(h)
            h = h.prev

    def _on_backward_end(self, g: _Group) -> None:
        if not g.valid or g.state not in (_LOADING, _LOADED):
            return
        self._wait(g)
        for e in g.entries.values():
            if not e.keep:
                e.dev = None
        g.state = _RELEASED

    def _finalize(self) -> None:
        """End of a micro-batch (end of backward, or leaving activate()): release everything."""
        if not self._groups:
            self._callback_queued = False
            return
        if self.cuda and self._compute is not None:
            self._compute.wait_stream(self._d2h)
            self._compute.wait_stream(self._h2d)
        for g in self._groups:
            g.valid = False
            g.prev = None
            g.entries = {}
        self._last = {"offloaded_bytes": self._offloaded_bytes, "n_groups": len(self._groups),
                      "kept_bytes": self._kept_bytes}
        self._groups, self._inflight = [], []
        self._offloaded_bytes = self._kept_bytes = 0
        self._callback_queued = False
        self.pool.reset()
