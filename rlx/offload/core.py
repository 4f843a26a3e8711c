"""Layer-grouped activation offload: groups, saved-tensor hooks, streams and the per-layer wrapper.

Each decoder-layer call inside `activate()` opens a group. While the layer runs, a saved-tensors hook pair
sends every eligible saved tensor to that group; one copy is made per *storage* and every saved view is
restored with its exact dtype/shape/stride/offset (never de-duplicated by data pointer alone). The copy of a
storage to host memory starts on a D2H stream as soon as it is packed (the stream waits for the compute
stream at that point), so the copy engine runs while the layer itself still computes. At the end of layer
i+1 the compute stream waits for group i's copies and the device copies are dropped, so at most two groups
are resident; the last groups (last layer, head) are dropped right after the output projection's forward, so
their copies overlap it. In backward, a tensor hook on the output projection's output (the first thing
backward reaches after the loss) and on each layer's output (layer i's backward starts) make the group
resident and prefetch the next `prefetch_layers` groups on an H2D stream, storage by storage in reverse pack
order with an event each, so an unpack waits only for its own storage; an identity function on the layer's
inputs marks "layer i's backward is done" and group i's device copies are dropped. Groups are keyed by call
order, not layer index, so a skipped (or repeated) layer is handled. Whatever the hooks see, an unpack always
works: a group not yet resident is loaded from its host copy, which lives until the end of the micro-batch.

A float32 storage that autograd made by upcasting a bfloat16/float16 tensor (`x.to(torch.float32)`, as in
RMSNorm) holds only values of the narrow type; it travels in the narrow type (half the bytes) and is widened
back on the H2D stream: bit for bit the same float32 values. A storage that is the whole output of an
elementwise `silu` or `mul` whose inputs are storages of the same group (a gated MLP's activation and product)
is not copied at all (`rebuild_pointwise`): when the group comes back, it is recomputed from those inputs by
the same kernel on the H2D stream, so it is bit for bit what forward produced.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlx.config.offload import ActivationOffloadConfig

from .exact import narrow_dtype, rebuild, recipe
from .pool import HostPool

# group states
_BUILDING, _COPYING, _ON_HOST, _LOADING, _LOADED, _RELEASED = range(6)


class _Entry:
    """One storage of a group: `src` (device, until its copy is done), `host` slice, `dev` (reloaded)."""

    __slots__ = ("src", "host", "dev", "nbytes", "keep", "narrow", "t", "ver", "ev", "waited", "recipe")

    def __init__(self, src: torch.Tensor, nbytes: int):
        self.src: Optional[torch.Tensor] = src
        self.host: Optional[torch.Tensor] = None
        self.dev: Optional[torch.Tensor] = None
        self.nbytes = nbytes
        self.keep = False  # the pool was full (or the storage changed after its copy): stays on the device
        self.narrow = None  # float32 storage that travels as this narrower dtype (exact, see module doc)
        self.t: Optional[torch.Tensor] = None  # first saved tensor and its version, until the layer ends
        self.ver = 0
        self.ev = None  # H2D event of this storage's copy back
        self.waited = True
        self.recipe = None  # (op, [(source entry, its saved view)], dtype, shape): rebuilt, not copied


class _Group:
    __slots__ = ("seq", "layer_idx", "offload", "keep_ptrs", "entries", "prev", "state",
                 "d2h_event", "h2d_event", "valid", "n_packed", "produced")

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
        self.valid = True
        self.n_packed = 0
        self.produced: Dict[Tuple[int, int], tuple] = {}  # while building: see exact.recipe


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


def _view(base: torch.Tensor, p: _Packed) -> torch.Tensor:
    """The exact saved view `p` (dtype/shape/stride/offset) over the storage of `base` (a device uint8 tensor)."""
    return torch.empty(0, dtype=p.dtype, device=base.device).set_(base.untyped_storage(), p.offset, p.shape, p.stride)


def _as(t_u8: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A flat `dtype` view of a flat uint8 tensor (same bytes)."""
    return t_u8.view(dtype)


def _param_ptrs(modules) -> set:
    """Data pointers of the storages of the modules' parameters and buffers as they are now: the tensors
    registered there (plain, FSDP1 flat parameters and use_orig_params views, FSDP2 unsharded parameters) and,
    for DTensors (FSDP2 between forwards), their local shards."""
    ptrs = set()
    for m in modules:
        for t in list(m._parameters.values()) + list(m._buffers.values()):
            if t is None:
                continue
            for x in (t, getattr(t, "_local_tensor", None)):
                if x is None:
                    continue
                try:
                    ptrs.add(x.untyped_storage().data_ptr())
                except (RuntimeError, NotImplementedError):
                    pass
    return ptrs


def _tensors_in(obj) -> List[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors_in(o)]
    return []


def _on_grads_done(tensors, fn) -> None:
    """Call `fn()` once the gradients of all grad-requiring `tensors` are complete (when backward is about to go
    past them). Tensor hooks only: no node is inserted, so autograd sums each tensor's gradient contributions
    in the same order as without offload (an identity node would sum the layer's own contributions first)."""
    ts = [t for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad]
    if len(ts) == 1:
        ts[0].register_hook(lambda grad: fn())
    elif ts:
        torch.autograd.graph.register_multi_grad_hook(ts, lambda grads: fn(), mode="all")


def _on_grad_arrives(t: torch.Tensor, fn) -> None:
    """Call `fn()` when backward reaches the node that made `t` (after the tensor hooks of `t`, so a layer whose
    input is `t` is released before the layer that produced `t` is loaded)."""
    if t.grad_fn is not None:
        t.grad_fn.register_prehook(lambda grads: fn())
    else:
        t.register_hook(lambda grad: fn())


class ActivationOffloader:
    """Returned by `apply_activation_offload`; see the module docstring and docs/offload.md."""

    def __init__(self, layers: List[nn.Module], owners: List[List[nn.Module]], cfg: ActivationOffloadConfig,
                 checkpointing: bool, device: torch.device, layer_class: str, head: List[nn.Module] = (),
                 head_owners: List[List[nn.Module]] = (), root: Optional[nn.Module] = None):
        self.cfg = cfg
        # every module of the model: its parameters stay on the device wherever they are used
        self._all_mods = list(root.modules()) if root is not None else []
        self._model_ptrs: set = set()
        self.layers = list(layers)  # decoder layers
        head = list(head)
        # the output projection (last of `head`): its forward ends the model's part of forward, and the gradient
        # of its output is the first thing backward reaches after the loss
        self._out_proj = head[-1] if head else None
        self.head = head if cfg.offload_head else []  # final norm / output projection, offloaded as groups
        self.owners = list(owners) + (list(head_owners) if cfg.offload_head else [])
        n = len(self.layers)
        modules = self.layers + self.head
        keep_last = cfg.keep_last_layers
        if keep_last is None:
            keep_last = 0 if checkpointing else 1
        self.keep_last_layers = keep_last
        # per patched module: offload its group? checkpoint it? (never the output projection: too costly)
        self._offload = [i < n - max(keep_last, 0) or i >= n for i in range(len(modules))]
        self._ckpt = [checkpointing and (i < n or not isinstance(m, nn.Linear)) for i, m in enumerate(modules)]
        self._n_modules = len(modules)
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
        self._in_layer = False
        self._groups: List[_Group] = []
        self._inflight: List[_Group] = []
        self._callback_queued = False
        self._offloaded_bytes = 0
        self._moved_bytes = 0
        self._last: Dict[str, int] = {"offloaded_bytes": 0, "moved_bytes": 0, "n_groups": 0, "kept_bytes": 0,
                                      "rebuilt_bytes": 0}
        self._kept_bytes = 0
        self._rebuilt_bytes = 0
        self._owner_mods = []  # per patched module: the modules whose parameters/buffers it may save
        for own in self.owners:
            seen, mods = set(), []
            for m in own:
                for x in m.modules():
                    if id(x) not in seen:
                        seen.add(id(x))
                        mods.append(x)
            self._owner_mods.append(mods)
        self._originals = []
        self._handles = []
        for i, m in enumerate(modules):
            self._patch(i, m)
        if cfg.recompute_mlp:
            for i, layer in enumerate(self.layers):
                mlp = getattr(layer, "mlp", None)
                if isinstance(mlp, nn.Module) and not self._ckpt[i]:
                    self._patch_mlp(mlp)
        if self._out_proj is not None and not self.head:
            self._handles.append(self._out_proj.register_forward_hook(self._out_proj_hook))

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
        self._model_ptrs = _param_ptrs(self._all_mods)
        self._active = True
        try:
            yield self
        finally:
            self._active = False
            self._finalize()

    def describe(self) -> str:
        s = self.stats()
        return (f"activation offload: {s['n_layers']} x {self.layer_class}, checkpointing="
                f"{'on' if self.checkpointing else 'off'}, keep_last_layers={self.keep_last_layers}, "
                f"offload_head={bool(self.head)}, recompute_mlp={self.cfg.recompute_mlp and not self.checkpointing}, "
                f"prefetch_layers={self.cfg.prefetch_layers}, rebuild_pointwise={self.cfg.rebuild_pointwise}, "
                f"min_tensor_bytes={self.cfg.min_tensor_bytes}, "
                f"device={self.device}, {'pinned ' if self.pool.pin_memory else ''}pool={s['pool_bytes']} bytes in "
                f"{s['pool_chunks']} chunks, last micro-batch: {s['n_groups']} groups, "
                f"{s['offloaded_bytes_last_step']} bytes offloaded ({s['moved_bytes_last_step']} moved each way, "
                f"{s['rebuilt_bytes_last_step']} rebuilt elementwise)")

    def stats(self) -> dict:
        return {
            "n_layers": len(self.layers),
            "n_groups": self._last["n_groups"],
            "pool_bytes": self.pool.capacity,
            "pool_chunks": len(self.pool.chunks),
            "pool_chunk_allocs": self.pool.n_chunk_allocs,
            "pool_peak_used_bytes": self.pool.peak_used,
            "offloaded_bytes_last_step": self._last["offloaded_bytes"],
            "moved_bytes_last_step": self._last["moved_bytes"],
            "kept_bytes_last_step": self._last["kept_bytes"],
            "rebuilt_bytes_last_step": self._last["rebuilt_bytes"],
        }

    def remove(self) -> None:
        """Undo the layer patching (the model behaves as before apply_activation_offload)."""
        for layer, had, orig in self._originals:
            if had:
                layer.forward = orig
            else:
                del layer.forward
        self._originals = []
        for h in self._handles:
            h.remove()
        self._handles = []

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

    def _patch_mlp(self, mlp: nn.Module) -> None:
        had = "forward" in mlp.__dict__
        orig = mlp.forward
        self._originals.append((mlp, had, mlp.__dict__.get("forward")))

        def forward(*args, **kwargs):
            if not (self._active and self._in_layer and torch.is_grad_enabled()):
                return orig(*args, **kwargs)
            # only the MLP's input is saved (through the layer's offload hook); the rest is recomputed
            return checkpoint(orig, *args, use_reentrant=False, **kwargs)

        mlp.forward = forward

    def _keep_ptrs(self, idx: int, args, kwargs) -> set:
        """Storages that stay on the device in this layer: the parameters and buffers of the modules it may use,
        read now (FSDP swaps unsharded parameters in and out), and inputs that need no grad (shared by every
        layer: rotary cos/sin, masks). Parameters are recognised by storage, never by `is_leaf`: a view made
        inside a custom Function's forward (Liger's `X.view(-1, d)`) is a leaf that requires grad, and an
        activation."""
        ptrs = _param_ptrs(self._owner_mods[idx]) | self._model_ptrs
        for t in _tensors_in((args, kwargs)):
            if not t.requires_grad and type(t) is torch.Tensor:
                ptrs.add(t.untyped_storage().data_ptr())
        return ptrs

    def _run_layer(self, idx: int, orig, args, kwargs):
        if not args and "hidden_states" in kwargs:  # positional, so checkpoint saves (and we offload) it
            kwargs = dict(kwargs)
            args = (kwargs.pop("hidden_states"),)
        offload = self._offload[idx]
        prev = self._groups[-1] if self._groups else None
        g = _Group(len(self._groups), idx, offload, self._keep_ptrs(idx, args, kwargs), prev)
        self._groups.append(g)
        # backward of this layer is done when the gradients of its inputs are complete
        _on_grads_done(args, lambda: self._on_backward_end(g))
        was_in = self._in_layer
        self._in_layer = not self._ckpt[idx]
        try:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(g, t), self._unpack):
                if self._ckpt[idx]:
                    out = checkpoint(orig, *args, use_reentrant=False, **kwargs)
                else:
                    out = orig(*args, **kwargs)
        finally:
            self._in_layer = was_in
        # backward of this layer starts when the gradient of its output arrives: a tensor hook, so the output
        # stays the layer's own tensor (not a view: FSDP2 warns about views, in-place ops on them lose hooks)
        for t in _tensors_in(out if isinstance(out, (tuple, list)) else [out])[:8]:
            if t.requires_grad:
                _on_grad_arrives(t, lambda: self._on_backward_start(g))
        self._end_forward(g)
        return out

    def _out_proj_hook(self, module, inputs, out):
        """Forward hook of the output projection when it is not itself a group (offload_head=False)."""
        if not self._active or not torch.is_grad_enabled() or not self._groups:
            return None
        self._flush()  # the last layers' copies overlapped the projection; now they must be done
        g = self._groups[-1]
        for t in _tensors_in(out)[:1]:
            if t.requires_grad:
                _on_grad_arrives(t, lambda: self._on_backward_start(g))
        return None

    # ------------------------------------------------------------------ hooks
    def _eligible(self, g: _Group, t: torch.Tensor) -> bool:
        if not g.offload or type(t) is not torch.Tensor or t.layout != torch.strided:
            return False
        if t.device != self.device or t.is_quantized or t.is_conj() or t.is_neg():
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
            e = _Entry(_u8_view(st, t.device), st.nbytes())
            e.recipe = recipe(g.produced, t, e.nbytes) if self.cfg.rebuild_pointwise else None
            g.entries[key] = e
            e.t, e.ver = t, t._version
            if e.recipe is None:
                e.narrow = narrow_dtype(t, e.nbytes)
                self._copy_out(e)
            else:
                self._offloaded_bytes += e.nbytes
                self._rebuilt_bytes += e.nbytes
        g.n_packed += 1
        packed = _Packed(g, key, t)
        if t.grad_fn is not None and self.cfg.rebuild_pointwise:
            g.produced[(id(t.grad_fn), t.output_nr)] = (t.grad_fn, g.entries[key], packed)
        return packed

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
        if e.dev is None and e.src is None:
            self._load(g)
        if e.dev is not None:
            if not e.waited:
                if self.cuda and e.ev is not None:
                    self._compute.wait_event(e.ev)
                e.waited = True
            base = e.dev
        else:  # still being built or copied: the device copy is intact
            base = e.src
        return _view(base, p)

    # ------------------------------------------------------------------ forward side
    def _copy_out(self, e: _Entry) -> None:
        """Start the copy of one storage to the host (at pack time, after what the compute stream has queued)."""
        nb = e.nbytes // 2 if e.narrow is not None else e.nbytes
        e.host = self.pool.allocate(nb)
        if e.host is None:
            e.keep, e.narrow = True, None
            self._kept_bytes += e.nbytes
            return
        self._offloaded_bytes += e.nbytes
        self._moved_bytes += nb
        if self.cuda:
            self._d2h.wait_stream(self._compute)
            with torch.cuda.stream(self._d2h):
                src = e.src if e.narrow is None else _as(e.src, torch.float32).to(e.narrow).view(torch.uint8)
                e.host.copy_(src, non_blocking=True)  # a narrowed temporary lives in the D2H stream's pool
        else:
            e.host.copy_(e.src if e.narrow is None else _as(e.src, torch.float32).to(e.narrow).view(torch.uint8))

    def _end_forward(self, g: _Group) -> None:
        if g.state != _BUILDING:
            return
        if g.offload and g.entries:
            changed = {id(e) for e in g.entries.values() if e.t is not None and e.t._version != e.ver}
            for e in g.entries.values():
                if e.recipe is not None and not e.keep and (id(e) in changed or any(
                        id(s) in changed for s, _ in e.recipe[1])):
                    e.keep, e.recipe = True, None  # its inputs (or itself) changed after forward: keep it
                    self._kept_bytes += e.nbytes
                    self._rebuilt_bytes -= e.nbytes
                    self._offloaded_bytes -= e.nbytes
            for e in g.entries.values():
                if id(e) in changed and not e.keep:
                    # written in place after it was packed (autograd would normally refuse this): copy again,
                    # or keep it on the device if it was travelling narrowed
                    if e.narrow is not None:
                        e.keep = True
                        self._kept_bytes += e.nbytes
                    else:
                        e.narrow = None
                        if self.cuda:
                            self._d2h.wait_stream(self._compute)
                            with torch.cuda.stream(self._d2h):
                                e.host.copy_(e.src, non_blocking=True)
                        else:
                            e.host.copy_(e.src)
                e.t = None
            g.produced = {}
            if self.cuda:
                g.d2h_event = torch.cuda.Event()
                g.d2h_event.record(self._d2h)
            g.state = _COPYING
        else:
            for e in g.entries.values():
                e.dev, e.src, e.keep, e.t = e.src, None, True, None
            g.state = _LOADED
        # at most two groups resident: the one just finished (copying) and the next one being built. The last
        # decoder layer and the head modules defer this to the end of the output projection's forward when one
        # is known, so that their copies overlap it (it is not where the peak is; the loss after it may be).
        hooked = self._out_proj is not None and not self.head  # the projection's forward hook flushes
        last = g.layer_idx == self._n_modules - 1 and not hooked
        tail = g.layer_idx >= len(self.layers) - 1 and self._out_proj is not None
        if not tail:
            for h in self._inflight:
                if h is not g:
                    self._drop_src(h)
            self._inflight = []
        if g.state == _COPYING:
            self._inflight.append(g)
        if last:
            self._flush()

    def _flush(self) -> None:
        for h in self._inflight:
            self._drop_src(h)
        self._inflight = []

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
            if g in self._inflight:
                self._inflight.remove(g)
            g.state = _LOADED
            return
        if g.state not in (_ON_HOST, _RELEASED):
            return
        todo = [e for e in reversed(list(g.entries.values())) if e.dev is None]  # backward needs the last first
        done = {id(e) for e in g.entries.values() if e.dev is not None}  # kept on the device: nothing to do
        if self.cuda:
            with torch.cuda.stream(self._compute):  # allocate on the compute stream (it frees them)
                for e in todo:
                    e.dev = torch.empty(e.nbytes, dtype=torch.uint8, device=self.device)
            self._h2d.wait_stream(self._compute)
            with torch.cuda.stream(self._h2d):
                for e in todo:
                    self._bring_back(e, done)
                if todo:
                    g.h2d_event = torch.cuda.Event()
                    g.h2d_event.record(self._h2d)
        else:
            for e in todo:
                e.dev = torch.empty(e.nbytes, dtype=torch.uint8)
            for e in todo:
                self._bring_back(e, done)
        g.state = _LOADING

    def _bring_back(self, e: _Entry, done: set) -> None:
        """Fill `e.dev` (allocated) from its host copy, or rebuild it from its sources (brought back first).
        On CUDA this runs on the H2D stream and records the event that an unpack of `e` waits for."""
        if id(e) in done:
            return
        done.add(id(e))
        if e.recipe is not None:
            op, srcs, dtype, shape = e.recipe
            args = []
            for s, view in srcs:
                self._bring_back(s, done)
                args.append(_view(s.dev, view))
            rebuild(op, args, torch.empty(0, dtype=dtype, device=self.device).set_(e.dev.untyped_storage(), 0, shape))
        elif e.narrow is None:
            e.dev.copy_(e.host, non_blocking=self.cuda)
        elif self.cuda:  # staging buffer from the H2D stream's pool, widened there
            stage = torch.empty(e.host.numel(), dtype=torch.uint8, device=self.device)
            stage.copy_(e.host, non_blocking=True)
            _as(e.dev, torch.float32).copy_(_as(stage, e.narrow))
        else:
            _as(e.dev, torch.float32).copy_(_as(e.host, e.narrow))
        if self.cuda:
            e.ev = torch.cuda.Event()
            e.ev.record(self._h2d)
            e.waited = False

    def _prefetch(self, h: Optional[_Group], n: int) -> None:
        while h is not None and n > 0:
            if h.offload and h.entries:
                self._load(h)
                n -= 1
            h = h.prev

    def _on_backward_start(self, g: _Group) -> None:
        if not g.valid:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
        self._flush()  # forward left groups in flight (no output projection seen): they must be done now
        self._load(g)
        self._prefetch(g.prev, max(self.cfg.prefetch_layers, 0))

    def _on_backward_end(self, g: _Group) -> None:
        if not g.valid or g.state not in (_LOADING, _LOADED):
            return
        if self.cuda and g.h2d_event is not None and any(not e.waited for e in g.entries.values()):
            self._compute.wait_event(g.h2d_event)  # a storage never unpacked: its copy must end before the free
        for e in g.entries.values():
            e.waited = True
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
            g.entries, g.produced = {}, {}
        self._last = {"offloaded_bytes": self._offloaded_bytes, "moved_bytes": self._moved_bytes,
                      "n_groups": len(self._groups), "kept_bytes": self._kept_bytes,
                      "rebuilt_bytes": self._rebuilt_bytes}
        self._groups, self._inflight = [], []
        self._offloaded_bytes = self._moved_bytes = self._kept_bytes = self._rebuilt_bytes = 0
        self._callback_queued = False
        self.pool.reset()
