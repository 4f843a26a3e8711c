"""The offloader's hold on the model: wrappers around the decoder layers (and head modules), the layer
boundaries that tell it where forward and backward are, and their removal.

Each wrapped module's `forward` is replaced on the instance. Outside `activate()` or without grad the wrapper
calls the original, unchanged. Inside, one call is one group:

    open the group -> hook its inputs ("backward of this call is done") -> run the original under the group's
    saved-tensor hooks (checkpointed, if enabled) -> hook its outputs ("backward reaches this call") -> close it

The boundaries are hooks, never nodes: the inputs get a tensor hook (`register_multi_grad_hook` for several),
which fires when their gradients are complete; the outputs get a pre-hook on the node that made them, which
runs after that node's tensor hooks, so on the tensor between two layers the later layer is released before the
earlier one is loaded. An identity node on a layer's input would be the one consumer there instead of the
layer's own ops, so a tensor that something else also uses (hidden states in the loss, a value head on an
intermediate layer) would get its gradient contributions summed in another order than without offload.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlx.ops.patch import patch_forward


def tensors_in(obj) -> List[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors_in(o)]
    return []


def on_grads_done(tensors: Sequence, fn: Callable[[], None]) -> None:
    """Call `fn()` once the gradients of all grad-requiring `tensors` are complete."""
    ts = [t for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad]
    if len(ts) == 1:
        ts[0].register_hook(lambda grad: fn())
    elif ts:
        torch.autograd.graph.register_multi_grad_hook(ts, lambda grads: fn(), mode="all")


def on_grad_arrives(t: torch.Tensor, fn: Callable[[], None]) -> None:
    """Call `fn()` when backward reaches the node that made `t` (after the tensor hooks of `t`)."""
    if t.grad_fn is not None:
        t.grad_fn.register_prehook(lambda grads: fn())
    else:
        t.register_hook(lambda grad: fn())


class Patches:
    """Wraps `modules` (decoder layers, then head modules) for `offloader`, which provides:
    `active`, `open_group(idx, args, kwargs)`, `saving_into(group)` (the saved-tensor hooks),
    `close_group(group)`, `backward_reached(group)`, `backward_done(group)`, `output_projection_done()`."""

    def __init__(self, offloader, modules: List[nn.Module], checkpointed: List[bool], recompute_mlp: List[nn.Module],
                 out_proj: Optional[nn.Module]):
        self._off = offloader
        self._ckpt = checkpointed
        self._in_layer = False  # inside a wrapped, not checkpointed call (recompute_mlp acts only there)
        self._undo: List[Callable[[], None]] = []  # restores each wrapped module's forward
        self._handles = []
        for i, m in enumerate(modules):
            self._wrap(m, self._module_forward(i, m.forward))
        for mlp in recompute_mlp:
            self._wrap(mlp, self._mlp_forward(mlp.forward))
        if out_proj is not None:
            self._handles.append(out_proj.register_forward_hook(self._out_proj_hook))

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        for h in self._handles:
            h.remove()
        self._handles = []

    def _wrap(self, m: nn.Module, forward: Callable) -> None:
        self._undo.append(patch_forward(m, forward))

    def _module_forward(self, idx: int, orig: Callable) -> Callable:
        off = self._off

        def forward(*args, **kwargs):
            if not off.active or not torch.is_grad_enabled():
                return orig(*args, **kwargs)
            if not args and "hidden_states" in kwargs:  # positional, so checkpoint saves (and we offload) it
                kwargs = dict(kwargs)
                args = (kwargs.pop("hidden_states"),)
            g = off.open_group(idx, args, kwargs)
            on_grads_done(args, lambda: off.backward_done(g))
            was_in, self._in_layer = self._in_layer, not self._ckpt[idx]
            try:
                with off.saving_into(g):
                    if self._ckpt[idx]:
                        out = checkpoint(orig, *args, use_reentrant=False, **kwargs)
                    else:
                        out = orig(*args, **kwargs)
            finally:
                self._in_layer = was_in
            # the output stays the layer's own tensor (not a view: FSDP2 warns about views, in-place ops on them
            # lose hooks)
            for t in tensors_in(out if isinstance(out, (tuple, list)) else [out])[:8]:
                if t.requires_grad:
                    on_grad_arrives(t, lambda: off.backward_reached(g))
            off.close_group(g)
            return out

        return forward

    def _mlp_forward(self, orig: Callable) -> Callable:
        off = self._off

        def forward(*args, **kwargs):
            if not (off.active and self._in_layer and torch.is_grad_enabled()):
                return orig(*args, **kwargs)
            # only the MLP's input is saved (through the layer's offload hook); the rest is recomputed
            return checkpoint(orig, *args, use_reentrant=False, **kwargs)

        return forward

    def _out_proj_hook(self, module, inputs, out):
        """Forward hook of the output projection when it is not itself a group (offload_head=False)."""
        if not self._off.active or not torch.is_grad_enabled():
            return None
        g = self._off.output_projection_done()
        if g is not None:
            for t in tensors_in(out)[:1]:
                if t.requires_grad:
                    on_grad_arrives(t, lambda: self._off.backward_reached(g))
        return None
