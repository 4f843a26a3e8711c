"""Exact ways to move fewer bytes than a saved storage holds (used by the offloader's pack hook).

- `narrow_dtype`: a float32 storage made by upcasting a bfloat16/float16 tensor holds only narrow values, so it
  can travel narrowed and be widened back to the same bits.
- `recipe` / `rebuild`: a storage that is the whole output of an elementwise silu/mul of tensors already packed
  in the same group need not travel at all; it is recomputed from them by the same kernel, to the same bits.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

_NARROW = (torch.bfloat16, torch.float16)

_POINTWISE = {"SiluBackward0": ("silu", 1), "MulBackward0": ("mul", 2)}  # grad_fn name: (op, inputs)


def recipe(produced: Dict[Tuple[int, int], tuple], t: torch.Tensor, nbytes: int):
    """How to rebuild the storage of `t` from tensors already packed in its group, if `t` (or the tensor it is
    a view of) is the untouched, dense, whole output of an elementwise silu/mul whose inputs are same-shape,
    same-dtype tensors packed there; else None. `produced` maps (id(grad_fn), output_nr) of each packed tensor
    to (grad_fn, entry, saved view): the op's inputs are found through `next_functions`, never by reading the
    node's saved tensors (that would run whatever unpack hook saved them, e.g. a recompute). The recipe is
    (op, [(entry, saved view) per input], dtype, shape)."""
    if t._base is not None:  # e.g. a Linear saves a 2-D view of its 3-D input
        t = t._base
    fn = t.grad_fn
    spec = _POINTWISE.get(type(fn).__name__) if fn is not None else None
    if fn is None or spec is None or t.storage_offset() != 0 or t._version != 0:
        return None
    if not t.is_contiguous() or t.numel() * t.element_size() != nbytes:
        return None
    nexts = fn.next_functions
    if len(nexts) != spec[1]:
        return None
    srcs = []
    for node, nr in nexts:
        hit = produced.get((id(node), nr)) if node is not None else None
        if hit is None:
            return None
        _, entry, view = hit
        if view.dtype != t.dtype or view.shape != t.shape:
            return None
        srcs.append((entry, view))
    return spec[0], srcs, t.dtype, t.shape


def narrow_dtype(t: torch.Tensor, nbytes: int):
    """The dtype a float32 storage can travel in exactly: that of the tensor it was upcast from, if it is the
    untouched whole output of `to(float32)` from bfloat16/float16; else None."""
    if t.dtype is not torch.float32 or t._base is not None or t.storage_offset() != 0 or t.numel() * 4 != nbytes:
        return None
    fn = t.grad_fn
    if fn is None or type(fn).__name__ != "ToCopyBackward0" or t._version != 0:
        return None
    try:
        src, i = fn.next_functions[0]
        if src is None:
            return None
        var = getattr(src, "variable", None)  # AccumulateGrad: a leaf
        dt = var.dtype if var is not None else src._input_metadata[i].dtype
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return None
    return dt if dt in _NARROW else None


def rebuild(op: str, args: List[torch.Tensor], out: torch.Tensor) -> None:
    """Recompute a `recipe`'s op into `out` (same kernel as forward's, so the same bits)."""
    if op == "silu":
        torch.ops.aten.silu.out(args[0], out=out)
    else:
        torch.mul(args[0], args[1], out=out)
