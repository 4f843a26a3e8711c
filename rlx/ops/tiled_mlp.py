"""Token-tiled MLP: a decoder layer's MLP runs `tile_tokens` tokens at a time, in forward and in backward.

A gated MLP's intermediates (`gate`, `up`, `act(gate)`, their product: ~4 x `[tokens, intermediate_size]`) are
the largest activations of a long sequence's layer. `apply_tiled_mlp(layers, tile_tokens)` replaces each
`layer.mlp.forward` so that, over the flattened batch*sequence tokens,

    forward (no grad)   out[tile] = mlp(x[tile])                     saved: x and the MLP's parameters
    backward            for each tile: recompute mlp(x[tile]) with grad on detached x/params,
                        autograd.grad -> grad_x[tile] (written in place), param grads summed over tiles

so only one tile's intermediates are alive at a time (forward keeps none of them). The parameters are explicit
inputs of the autograd function, so their gradients leave it once, summed, through autograd: under FSDP1
(`use_orig_params` views of the flat parameter) and FSDP2 (unsharded parameters) the gradient reaches the
parameter as for an ordinary layer, and nothing calls `backward()` inside. The recompute calls the MLP's own
forward (same kernels as untiled) with the parameters swapped for their detached copies. Without grad it is a
plain tiled loop (lower peak in long eval forwards); with at most `tile_tokens` tokens the MLP runs untouched.

Saved per token: the MLP input (H values) instead of H + ~4 x intermediate_size; while a tile is recomputed
in backward, its own intermediates and their gradients (~8 x [tile, intermediate_size]) are the extra peak.

Exactness (CPU float32, checked by tests/unit/test_ops.py): outputs and input gradients are row-wise, and every tile
runs at least `_MIN_ROWS` rows (see `_windows`), so they equal the untiled ones bit for bit. Parameter gradients
sum over tokens: untiled, the BLAS GEMM sums in K-blocks of its own choosing; the tiles' gradients added in
order into the first tile's float32 gradient reproduce it bit for bit when each tile is one such block (seen
with MKL 2024.2 sgemm on one AVX-512 Xeon: 192-token tiles once there are more than 384 tokens; on another
Xeon with the same MKL no tile size did), and differ by float32 rounding (~1e-6 relative) otherwise. Low-precision parameters accumulate their tile gradients in float32 and get them back cast once.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable, List, Optional, Tuple

import torch
from torch import nn

from .patch import patch_forward

__all__ = ["TiledMLPHandle", "apply_tiled_mlp"]

_Slot = Tuple[nn.Module, str]  # (submodule, attribute name) of one parameter

# Input gradients handed down to a tiled decoder layer that nothing else can see: that layer's backward may
# write its own input gradient into the same storage (one whole-sequence buffer less; rlx.ops.tiled_layer).
_EXCLUSIVE: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()  # id -> tensor


def is_exclusive(t: torch.Tensor) -> bool:
    return _EXCLUSIVE.get(id(t)) is t


def hand_down(ctx, grad_x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """`grad_x`, the gradient a tiled function returns for its first tensor input, marked as exclusive when it
    can only reach a tiled decoder layer's backward: the nodes between (FSDP's pre-forward identity, views)
    each have one edge, so the same tensor cannot be handed to anyone else."""
    if grad_x is None:
        return grad_x
    node = ctx.next_functions[0][0]
    for _ in range(4):
        if node is None:
            return grad_x
        if node.name() == "_TiledLayerBackward":
            _EXCLUSIVE[id(grad_x)] = grad_x
            return grad_x
        nxt = [n for n, _ in node.next_functions if n is not None]
        if len(nxt) != 1:
            return grad_x
        node = nxt[0]
    return grad_x


class TiledMLPHandle:
    """Returned by `apply_tiled_mlp`; `remove()` restores every patched MLP's forward."""

    def __init__(self, tile_tokens: int):
        self.tile_tokens = tile_tokens
        self._undo: List[Callable[[], None]] = []  # one per patched module, in patching order

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []


def apply_tiled_mlp(layers: List[nn.Module], tile_tokens: int) -> TiledMLPHandle:
    """Run each layer's `mlp` in tiles of `tile_tokens` tokens (batch and sequence flattened); see the module
    docstring. `layers` are the decoder layers (FSDP-wrapped or not), each with an `mlp` submodule that maps
    `[..., H]` to `[..., H']` token by token (HF Qwen2/Llama gate/up/down MLPs)."""
    if not isinstance(tile_tokens, int) or tile_tokens <= 0:
        raise ValueError(f"tile_tokens={tile_tokens!r}: must be a positive number of tokens per MLP tile")
    handle = TiledMLPHandle(tile_tokens)
    for i, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        if not isinstance(mlp, nn.Module):
            raise ValueError(f"apply_tiled_mlp: decoder layer {i} ({type(layer).__name__}) has no `mlp` module "
                             f"to tile; tile only models whose decoder layers have one")
        handle._undo.append(tile_tokenwise(mlp, tile_tokens))
    return handle


def tile_tokenwise(module: nn.Module, tile_tokens: int) -> Callable[[], None]:
    """Run any token-wise module (`[..., H]` -> `[..., H']`, each token on its own: an MLP, an RMSNorm) in
    tiles of `tile_tokens` tokens as the MLPs above; returns the function that undoes it."""
    return patch_forward(module, _tiled_forward(module, module.forward, tile_tokens))


def _tiled_forward(mlp: nn.Module, orig: Callable, tile: int) -> Callable:
    def forward(x, *args, **kwargs):
        if args or kwargs or not isinstance(x, torch.Tensor) or x.dim() < 2 or x.numel() <= tile * x.shape[-1]:
            return orig(x, *args, **kwargs)
        slots, params = _grad_params(mlp)
        if torch.is_grad_enabled() and (x.requires_grad or params):
            return _TiledMLP.apply(orig, slots, tile, x, *params)
        with torch.no_grad():
            return _tiled_loop(orig, x, tile)

    return forward


def _grad_params(mlp: nn.Module) -> Tuple[List[_Slot], List[torch.Tensor]]:
    """The tensors the MLP reads as parameters that require grad, read now: registered parameters (FSDP2
    swaps its unsharded ones in there) or, under FSDP1, the views it sets as plain attributes in forward."""
    slots: List[_Slot] = []
    params: List[torch.Tensor] = []
    for m in mlp.modules():
        found: List[Tuple[str, torch.Tensor]] = [(k, v) for k, v in m._parameters.items() if v is not None]
        found += [(k, v) for k, v in m.__dict__.items() if isinstance(v, torch.Tensor) and k not in m._parameters]
        for name, t in found:
            if t.requires_grad:
                slots.append((m, name))
                params.append(t)
    return slots, params


@contextlib.contextmanager
def _swapped(slots: List[_Slot], tensors: List[torch.Tensor]):
    """Temporarily replace the tensors at `slots` (where they live now: `_parameters` or `__dict__`)."""
    undo = []
    try:
        for (m, name), t in zip(slots, tensors):
            where: dict = m._parameters if name in m._parameters else m.__dict__
            undo.append((where, name, where[name]))
            where[name] = t
        yield
    finally:
        for where, name, t in reversed(undo):
            where[name] = t


_MIN_ROWS = 32  # a tile with fewer rows runs in a window of this many (see `_windows`)


def _windows(n: int, tile: int) -> List[Tuple[int, int, int]]:
    """(start, keep, end) per tile: the rows [start, end) are computed, [keep, end) are this tile's own.

    Tiles of `tile` rows; a tile of fewer than `_MIN_ROWS` rows (the last one, or every one if `tile` is that
    small) is computed in the window of the `_MIN_ROWS` rows that end with it and keeps its own rows only;
    backward gives the others a zero gradient, which adds exact zeros to the parameter gradients. BLAS
    libraries multiply a handful of rows with other kernels than the bulk of a matrix (MKL: below 12 rows),
    which round differently; the window keeps every row on the bulk path, so each row's result is the one
    the untiled matmul gives it."""
    out = []
    for keep in range(0, n, tile):
        end = min(keep + tile, n)
        start = keep if end - keep >= _MIN_ROWS else max(0, end - _MIN_ROWS)
        out.append((start, keep, end))
    return out


def _tiled_loop(fn: Callable, x: torch.Tensor, tile: int) -> torch.Tensor:
    """fn over tiles of x's tokens (x flattened to `[tokens, H]`), written into one output."""
    flat = x.reshape(-1, x.shape[-1])
    out = None
    for start, keep, end in _windows(flat.shape[0], tile):
        y = fn(flat[start:end])
        if out is None:
            out = y.new_empty((flat.shape[0], y.shape[-1]))
        out[keep:end] = y[keep - start:]
    assert out is not None, "no tokens to tile"
    return out.view(*x.shape[:-1], out.shape[-1])


class _TiledMLP(torch.autograd.Function):
    """out = mlp(x), tile by tile; the MLP's parameters are explicit inputs (their grads are returned)."""

    @staticmethod
    def forward(ctx, fn, slots, tile, x, *params):
        with torch.no_grad():
            out = _tiled_loop(fn, x, tile)
        ctx.save_for_backward(x, *params)
        ctx.fn, ctx.slots, ctx.tile = fn, slots, tile
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, *params = ctx.saved_tensors
        need_x, need_p = ctx.needs_input_grad[3], ctx.needs_input_grad[4:]
        flat = x.reshape(-1, x.shape[-1])
        g_flat = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = torch.empty_like(flat) if need_x else None
        leaves = [p.detach().requires_grad_(need) for p, need in zip(params, need_p)]
        wanted = [p for p, need in zip(leaves, need_p) if need]
        sums = _Sums(len(wanted))
        with torch.enable_grad(), _swapped(ctx.slots, leaves):
            for start, keep, end in _windows(flat.shape[0], ctx.tile):
                x_t = flat[start:end].detach().requires_grad_(need_x)
                # rows of the previous tile are computed again, but they contribute nothing
                y_t = ctx.fn(x_t)
                grads = torch.autograd.grad(y_t, ([x_t] if need_x else []) + wanted,
                                            _padded(g_flat, start, keep, end), allow_unused=True)
                if grad_x is not None:  # need_x
                    grad_x[keep:end] = 0 if grads[0] is None else grads[0][keep - start:]
                    grads = grads[1:]
                sums.add(grads)
        it = iter(sums.sums)
        p_grads = [_cast(next(it), p.dtype) if need else None for p, need in zip(params, need_p)]
        return (None, None, None, hand_down(ctx, None if grad_x is None else grad_x.reshape(x.shape)), *p_grads)


class _Sums:
    """Float32 (or wider) sums of the parameter gradients over tiles; the first tile's becomes the sum (no
    zero-fill, no extra add)."""

    def __init__(self, n: int):
        self.sums: List[Optional[torch.Tensor]] = [None] * n

    def add(self, grads) -> None:
        for i, g in enumerate(grads):
            if g is None:
                continue
            total = self.sums[i]
            if total is None:
                self.sums[i] = g if g.dtype in (torch.float32, torch.float64) else g.float()
            else:
                total.add_(g)


def _padded(full: torch.Tensor, start: int, keep: int, end: int) -> torch.Tensor:
    """The gradient rows of window [start, end): the tile's own rows [keep, end) of `full`, zeros before."""
    if keep == start:
        return full[start:end]
    return torch.cat([full.new_zeros((keep - start, *full.shape[1:])), full[keep:end]])


def _cast(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    return t if t is None or t.dtype == dtype else t.to(dtype)
