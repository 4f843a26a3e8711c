"""Layer-grouped activation offload: the offloader, which drives groups through their states.

Each decoder-layer call inside `activate()` opens a group (`group.py`: its states and events). While the layer
runs, a saved-tensors hook pair sends every eligible saved tensor to that group; one copy is made per *storage*
and every saved view is restored with its exact dtype/shape/stride/offset (never de-duplicated by data pointer
alone). The copy of a storage to host memory starts as soon as it is packed (`copies.py`: on a D2H stream on
CUDA), so the copy engine runs while the layer itself still computes.

Where forward and backward are comes from the layer boundaries (`patching.py`), and this class decides what
each one means for the groups:
- layer i+1's forward ends: group i's copies are due (at most two groups resident). The last decoder layer and
  the head modules wait until the output projection's forward is done, so their copies overlap it.
- backward reaches a layer (the gradient of its output arrives; for the last groups, of the output
  projection's output): its group is needed, and so are the `prefetch_layers` offloaded groups before it.
- the gradients of a layer's inputs are complete: its backward is done, its device copies go.
- end of backward (autograd callback) or leaving `activate()`: the micro-batch ends, everything is released.
Groups are keyed by call order, not layer index, so a skipped (or repeated) layer is handled. Whatever the
hooks see, an unpack always works: a group not resident is loaded from its host copy on the spot.

A float32 storage that autograd made by upcasting a bfloat16/float16 tensor travels narrowed, and a storage that
is the whole output of an elementwise `silu`/`mul` of storages of the same group is rebuilt on the way back
instead of copied (`exact.py`); both give back the same bits.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import List, Optional, Sequence

import torch
from torch import nn

from rlx.config.offload import ActivationOffloadConfig

from .copies import copy_engine
from .group import Group, GroupState, OffloadStats
from .patching import Patches, tensors_in
from .pool import HostPool


def _param_ptrs(modules) -> set:
    """Data pointers of the storages of the modules' parameters and buffers as they are now: the tensors
    registered there (plain, FSDP1 flat parameters and use_orig_params views, FSDP2 unsharded parameters) and,
    for DTensors (FSDP2 between forwards), their local shards."""
    ptrs = set()
    for m in modules:
        for t in list(m._parameters.values()) + list(m._buffers.values()):
            if t is None:
                continue
            t = getattr(t, "_local_tensor", t)  # a DTensor has no data pointer of its own
            try:
                ptrs.add(t.untyped_storage().data_ptr())
            except (RuntimeError, NotImplementedError):
                pass
    return ptrs


def _closure(owners: List[nn.Module]) -> List[nn.Module]:
    """Every module under `owners`, once."""
    seen, mods = set(), []
    for m in owners:
        for x in m.modules():
            if id(x) not in seen:
                seen.add(id(x))
                mods.append(x)
    return mods


class ActivationOffloader:
    """Returned by `apply_activation_offload`; see the module docstring and docs/offload.md."""

    def __init__(self, layers: List[nn.Module], owners: List[List[nn.Module]], cfg: ActivationOffloadConfig,
                 checkpointing: bool, device: torch.device, layer_class: str, head: Sequence[nn.Module] = (),
                 head_owners: Sequence[List[nn.Module]] = (), root: Optional[nn.Module] = None,
                 recomputed: Optional[List[bool]] = None):
        self.cfg = cfg
        self.layers = list(layers)  # decoder layers
        head = list(head)
        # the output projection (last of `head`): its forward ends the model's part of forward, and the gradient
        # of its output is the first thing backward reaches after the loss
        self._out_proj = head[-1] if head else None
        self.head = head if cfg.offload_head else []  # final norm / output projection, offloaded as groups
        n = len(self.layers)
        modules = self.layers + self.head
        keep_last = cfg.keep_last_layers
        if keep_last is None:
            keep_last = 0 if checkpointing else 1
        self.keep_last_layers = keep_last
        # per wrapped module: offload its group? checkpoint it? (never the output projection: too costly)
        self._offload = [i < n - max(keep_last, 0) or i >= n for i in range(len(modules))]
        # a layer that recomputes itself (a tiled layer) saves only its input already: not checkpointed again
        again = list(recomputed or [False] * n) + [False] * len(self.head)
        ckpt = [checkpointing and (i < n or not isinstance(m, nn.Linear)) and not again[i]
                for i, m in enumerate(modules)]
        self._n_modules = len(modules)
        self.checkpointing = checkpointing
        self.device = device
        self.layer_class = layer_class
        self.pool = HostPool(cfg.pool_chunk_bytes, cfg.pin_memory and device.type == "cuda", cfg.max_pool_bytes)
        self._copies = copy_engine(device)
        # per wrapped module: the modules whose parameters/buffers it may save; and every module of the model
        self._owner_mods = [_closure(own) for own in list(owners) + (list(head_owners) if cfg.offload_head else [])]
        self._all_mods = list(root.modules()) if root is not None else []
        self._model_ptrs: set = set()
        self.active = False
        self._groups: List[Group] = []
        self._inflight: List[Group] = []  # groups whose copies out are not yet due
        self._callback_queued = False
        self._stats = OffloadStats()  # this micro-batch
        self._last = OffloadStats()  # the last finished one
        mlps = []
        if cfg.recompute_mlp:
            mlps = [layer.get_submodule("mlp") for i, layer in enumerate(self.layers)
                    if isinstance(getattr(layer, "mlp", None), nn.Module) and not ckpt[i]]
        hooked = self._out_proj if self._out_proj is not None and not self.head else None
        self._patches = Patches(self, modules, ckpt, mlps, hooked)

    # ------------------------------------------------------------------ public API
    @contextlib.contextmanager
    def activate(self):
        """Offload (and, if enabled, checkpoint) the decoder layers for one micro-batch's forward+backward."""
        if self.active:
            raise RuntimeError("ActivationOffloader.activate() does not nest")
        for layer in self.layers:
            if getattr(layer, "gradient_checkpointing", False) and layer.training:
                raise RuntimeError(
                    "HF gradient checkpointing is enabled on a decoder layer while activation offload is on "
                    "(model.enable_activation_offload): both need the saved-tensor hooks. Disable HF "
                    "checkpointing and pass enable_gradient_checkpointing=True to apply_activation_offload.")
        self._copies.begin()
        self._model_ptrs = _param_ptrs(self._all_mods)
        self.active = True
        try:
            yield self
        finally:
            self.active = False
            self._micro_batch_ended()

    def reserve_pool(self, tokens: int, hidden_size: int, dtype: torch.dtype) -> int:
        """Size the host pool now for a micro-batch of `tokens` tokens (cfg.reserve_pool, with checkpointing:
        each offloaded group then holds one `[tokens, hidden_size]` input of `dtype`); returns the bytes reserved
        (0 when off, without checkpointing, or when the pool is already that large)."""
        if not (self.cfg.reserve_pool and self.checkpointing) or tokens <= 0:
            return 0
        groups = sum(self._offload)  # offloaded decoder layers and head modules
        piece = tokens * hidden_size * torch.empty((), dtype=dtype).element_size()  # one group's input
        return self.pool.reserve(groups * piece, piece)

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
        last = asdict(self._last)
        return {
            "n_layers": len(self.layers),
            "n_groups": last["n_groups"],
            "pool_bytes": self.pool.capacity,
            "pool_chunks": len(self.pool.chunks),
            "pool_chunk_allocs": self.pool.n_chunk_allocs,
            "pool_peak_used_bytes": self.pool.peak_used,
            **{f"{k}_last_step": last[k] for k in ("offloaded_bytes", "moved_bytes", "kept_bytes", "rebuilt_bytes")},
        }

    def remove(self) -> None:
        """Undo the layer patching (the model behaves as before apply_activation_offload)."""
        self._patches.remove()

    # ------------------------------------------------------------------ forward (called by the wrappers)
    def open_group(self, idx: int, args, kwargs) -> Group:
        prev = self._groups[-1] if self._groups else None
        g = Group(len(self._groups), idx, self._keep_ptrs(idx, args, kwargs), prev, self._copies, self.pool,
                  self._stats, self.cfg.rebuild_pointwise)
        self._groups.append(g)
        return g

    def saving_into(self, g: Group):
        offload = self._offload[g.layer_idx]
        return torch.autograd.graph.saved_tensors_hooks(
            lambda t: g.pack(t) if offload and g.state is GroupState.PACKING and self._eligible(g, t) else t,
            _unpack)

    def close_group(self, g: Group) -> None:
        g.forward_ended()
        # at most two groups resident: the one just finished (copying) and the next one being built. The last
        # decoder layer and the head modules defer this to the end of the output projection's forward when one
        # is known, so that their copies overlap it (it is not where the peak is; the loss after it may be).
        hooked = self._out_proj is not None and not self.head  # the projection's forward hook flushes
        last = g.layer_idx == self._n_modules - 1 and not hooked
        tail = g.layer_idx >= len(self.layers) - 1 and self._out_proj is not None
        if not tail:
            for h in self._inflight:
                if h is not g:
                    h.copies_due()
            self._inflight = []
        if g.state is GroupState.COPYING:
            self._inflight.append(g)
        if last:
            self._flush()

    def output_projection_done(self) -> Optional[Group]:
        """The output projection's forward returned (when it is no group itself): the last layers' copies
        overlapped it and are due now. Returns the group whose backward starts at its output's gradient."""
        if not self._groups:
            return None
        self._flush()
        return self._groups[-1]

    def _flush(self) -> None:
        for h in self._inflight:
            h.copies_due()
        self._inflight = []

    def _keep_ptrs(self, idx: int, args, kwargs) -> set:
        """Storages that stay on the device in this call: the parameters and buffers of the model and of the
        modules this layer may use, read now (FSDP swaps unsharded parameters in and out), and inputs that need
        no grad (shared by every layer: rotary cos/sin, masks). Parameters are recognised by storage, never by
        `is_leaf`: a view made inside a custom Function's forward (Liger's `X.view(-1, d)`) is a leaf that
        requires grad, and an activation."""
        ptrs = _param_ptrs(self._owner_mods[idx]) | self._model_ptrs
        for t in tensors_in((args, kwargs)):
            if not t.requires_grad and type(t) is torch.Tensor:
                ptrs.add(t.untyped_storage().data_ptr())
        return ptrs

    def _eligible(self, g: Group, t: torch.Tensor) -> bool:
        if type(t) is not torch.Tensor or t.layout != torch.strided:
            return False
        if t.device != self.device or t.is_quantized or t.is_conj() or t.is_neg():
            return False
        st = t.untyped_storage()
        nb = st.nbytes()
        return nb > 0 and nb >= self.cfg.min_tensor_bytes and st.data_ptr() not in g.keep_ptrs

    # ------------------------------------------------------------------ backward (called by the hooks)
    def backward_reached(self, g: Group) -> None:
        if g.state is GroupState.CLOSED:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._micro_batch_ended)
        # this group and the `prefetch_layers` offloaded ones before it; a group forward left copying (no
        # output projection ran: a fused head that reads its weight directly) keeps its device copies
        g.needed()
        h, n = g.prev, max(self.cfg.prefetch_layers, 0)
        while h is not None and n > 0:
            if h.state is not GroupState.KEPT:
                h.needed()
                n -= 1
            h = h.prev
        self._flush()  # the rest of what forward left in flight is due now

    def backward_done(self, g: Group) -> None:
        g.backward_done()

    def _micro_batch_ended(self) -> None:
        """End of a micro-batch (end of backward, or leaving activate()): release everything."""
        self._callback_queued = False
        if not self._groups:
            return
        self._copies.finish()
        for g in self._groups:
            g.micro_batch_ended()
        self._stats.n_groups = len(self._groups)
        self._last, self._stats = self._stats, OffloadStats()
        self._groups, self._inflight = [], []
        self.pool.reset()


def _unpack(p):
    return p if isinstance(p, torch.Tensor) else p.group.unpack(p)
