"""Token-tiled decoder layers: everything token-local in a layer runs `tile_tokens` tokens at a time, in forward
and in the recompute of backward; only what attention needs whole is ever whole.

A Qwen2/Llama-style HF decoder layer (transformers 5.x) is

    pre   (token-local)  h = input_layernorm(x);  q, k, v = rotary(q_proj(h)), rotary(k_proj(h)), v_proj(h)
    attn  (whole)        o = attention(q, k, v)                      (SDPA / flash / rlx's packed SDPA)
    post  (token-local)  h2 = x + o_proj(o);  y = h2 + mlp(post_attention_layernorm(h2))

`apply_tiled_layers(layers, tile_tokens)` replaces each layer's `forward` with one autograd function that saves
only the layer input `x` (and the parameters) and recomputes in backward, like activation checkpointing, but
never holds a whole-sequence token-local intermediate (the RMSNorms' float32 copies, projections, rotary,
residual sums, the MLP's intermediates, or their gradients):

    forward (no grad)  q, k, v = pre(x) tile by tile into whole buffers;  o = attn(q, k, v);  y = post(x, o) by tiles
    backward           q, k, v = pre(x) by tiles (no grad);  o = attn(q, k, v) with grad
                       per tile: recompute post(x_t, o_t), differentiate -> dx_t (residual part), do_t, param grads
                       dq, dk, dv = attention backward(do), per KV head group    (o, do freed group by group)
                       per tile: recompute pre(x_t), differentiate with (dq_t, dk_t, dv_t) and the residual part
                       seeded first -> dx_t, param grads

Whole at once, per token: x, the incoming gradient (which becomes dx in place when the tiled layer or final norm
above handed it down and nothing else can hold it: `hand_down`); q, k, v and their gradients; the attention
output, its gradient and the attention's own saved state (log-sum-exp). The tiles' own intermediates exist one tile at a
time. The final norm of the model (`final_norm`) is tiled as a token-wise module too.

The layer is its own checkpoint: do not checkpoint it again (`FSDPEngine` skips HF checkpointing of tiled
layers; `apply_activation_offload(..., recomputed=...)` offloads their saved input without checkpointing).
Parameters are explicit inputs of the function (FSDP1 `use_orig_params` views and FSDP2 unsharded parameters
alike, read at call time as `rlx.ops.tiled_mlp` does), so their gradients leave it once, summed over tiles.

Exactness (CPU float32, tests/unit/test_ops.py): outputs and input gradients equal the untiled layer's bit for bit.
The ops are the layer's own modules and functions on row slices (every tile at least `_MIN_ROWS` rows), the
attention sees q/k/v with the untiled values and strides, and the gradient of `x` is accumulated in the order
autograd uses untiled: the residual part first, then the norm's. Parameter gradients are sums over tiles: equal
up to float summation order (see `rlx.ops.tiled_mlp` on BLAS K-blocks). With no grad the layer runs tiled only
above `tile_tokens` tokens (a plain loop, lower peak in long log-prob passes); under grad it always runs as the
function (one tile for a short sequence), so that it is checkpointed the same way at every length.
"""
from __future__ import annotations

import sys
from typing import Callable, List, Optional

import torch
from torch import nn

from .patch import patch_forward
from .tiled_mlp import TiledMLPHandle, _Sums, _cast, _grad_params, _padded, _swapped, _windows, hand_down, \
    is_exclusive, tile_tokenwise

__all__ = ["TiledLayerHandle", "apply_tiled_layers"]

_KEY = "model.tile_layer_tokens"


class TiledLayerHandle(TiledMLPHandle):
    """Returned by `apply_tiled_layers`: `layers` (they recompute themselves in backward) and `remove()`."""

    def __init__(self, tile_tokens: int):
        super().__init__(tile_tokens)
        self.layers: List[nn.Module] = []

    def remove(self) -> None:
        super().remove()
        self.layers = []


def apply_tiled_layers(layers: List[nn.Module], tile_tokens: int,
                       final_norm: Optional[nn.Module] = None) -> TiledLayerHandle:
    """Tile the token-local parts of each decoder layer (and `final_norm`, the model's last RMSNorm) over
    `tile_tokens` tokens (batch and sequence flattened); see the module docstring. Call before FSDP wrapping or
    after, on the layers `rlx.offload.find_decoder_layers` returns."""
    if not isinstance(tile_tokens, int) or tile_tokens <= 0:
        raise ValueError(f"{_KEY}={tile_tokens!r}: must be a positive number of tokens per layer tile")
    handle = TiledLayerHandle(tile_tokens)
    for i, layer in enumerate(layers):
        handle._undo.append(patch_forward(layer, _LayerPlan(layer, i, tile_tokens).forward))
        handle.layers.append(layer)  # each recomputes itself in backward: checkpoint none of them again
    if final_norm is not None:
        handle._undo.append(tile_tokenwise(final_norm, tile_tokens))
    return handle


def _attention_function(impl: str, mod) -> Callable:
    """The attention the layer's own forward would call (transformers' interface for the configured
    implementation `impl`, eager otherwise)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = getattr(mod, "eager_attention_forward", None)
    # transformers types `default` as a function; a family without an eager function (None) reads it only for eager
    if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):
        return ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)  # type: ignore[arg-type]
    return eager if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]  # type: ignore[return-value]


class _LayerPlan:
    """How one decoder layer splits into pre / attention / post (its own submodules and functions)."""

    _ATTN_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj"}

    def __init__(self, layer: nn.Module, idx: int, tile: int):
        attn = getattr(layer, "self_attn", None)
        names = {n for n, _ in layer.named_children()}
        need = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
        what = f"{_KEY}: decoder layer {idx} ({type(layer).__name__})"
        if not need <= names or names - need:
            raise ValueError(f"{what} has children {sorted(names)}; tiling supports the Qwen2/Llama layer "
                             f"{sorted(need)}. Set {_KEY}=0 for this model.")
        assert attn is not None  # a child, checked above
        extra = {n for n, m in attn.named_children() if any(True for _ in m.parameters())} - self._ATTN_CHILDREN
        mod = sys.modules[type(attn).__module__]
        # torch's rotary on [tokens, heads, d] tiles, even where Liger replaced the family's (rlx.engine.liger)
        rotary = getattr(mod, "_rlx_torch_rotary", None) or getattr(mod, "apply_rotary_pos_emb", None)
        if extra or not self._ATTN_CHILDREN <= {n for n, _ in attn.named_children()} or rotary is None:
            raise ValueError(f"{what}: its attention ({type(attn).__name__}) is not the q/k/v/o projections + "
                             f"rotary of Qwen2/Llama (extra: {sorted(extra)}). Set {_KEY}=0 for this model.")
        if float(getattr(attn, "attention_dropout", 0.0) or 0.0) != 0.0:
            raise ValueError(f"{what}: attention_dropout={attn.attention_dropout} would draw different masks in "
                             f"the recompute; set override_config.attention_dropout=0.0 or {_KEY}=0.")
        self.layer, self.attn, self.tile, self.rotary, self.mod = layer, attn, tile, rotary, mod
        self.orig = layer.forward  # the class's forward, bound (what runs untiled)

    # ---- the layer's parts, on `[n, ...]` token rows --------------------------------------------------
    def pre(self, x, cos, sin):
        a, d = self.attn, self.attn.head_dim
        h = self.layer.input_layernorm(x)  # type: ignore[operator]  # torch types a submodule as Tensor | Module
        q = a.q_proj(h).view(x.shape[0], -1, d)
        k = a.k_proj(h).view(x.shape[0], -1, d)
        v = a.v_proj(h).view(x.shape[0], -1, d)
        q, k = self.rotary(q, k, cos, sin)  # cos/sin `[n, d]`, unsqueezed to `[n, 1, d]`: per token, per head
        return q, k, v

    def head_groups(self, n_q: int, n_kv: int):
        """(query heads, KV heads) slices of each KV head's group: the attention of one group needs nothing of
        another (GQA: n_q / n_kv query heads share a KV head). One group of all heads under Ulysses sequence
        parallelism (`rlx.engine.ulysses`): its all-to-all splits the heads the layer passes among the ranks, so
        it gets them all, in one call, as the untiled layer passes them."""
        if n_kv <= 1 or n_q % n_kv or getattr(self.attn, "_rlx_sp_group", None) is not None:
            return [(slice(0, n_q), slice(0, n_kv))]
        per = n_q // n_kv
        return [(slice(j * per, (j + 1) * per), slice(j, j + 1)) for j in range(n_kv)]

    def post(self, x, o):
        h = x + self.attn.o_proj(o)
        return h + self.layer.mlp(self.layer.post_attention_layernorm(h))  # type: ignore[operator]  # as in pre

    def attention(self, q, k, v, shape, attention_mask, kwargs):
        """q/k/v `[tokens, heads, d]` buffers -> the attention output `[tokens, heads * d]` (a view of what the
        attention returns), through the `[B, heads, S, d]` views the untiled layer passes."""
        b, s = shape
        a = self.attn
        fn = _attention_function(a.config._attn_implementation, self.mod)
        extra = {"sliding_window": a.sliding_window} if hasattr(a, "sliding_window") else {}
        out, _ = fn(a, *(t.view(b, s, *t.shape[1:]).transpose(1, 2) for t in (q, k, v)), attention_mask,
                    dropout=0.0, scaling=a.scaling, **extra, **kwargs)
        return out.reshape(b * s, -1)

    # ---- the patched forward ------------------------------------------------------------------------------
    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                position_embeddings=None, **kwargs):
        x = hidden_states
        grad = torch.is_grad_enabled()
        if past_key_values is not None or position_embeddings is None or x.dim() != 3 or \
                (not grad and x.shape[0] * x.shape[1] <= self.tile):
            return self.orig(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, use_cache=use_cache,
                             position_embeddings=position_embeddings, **kwargs)
        b, s, hid = x.shape
        cos, sin = (t.expand(b, s, t.shape[-1]).reshape(b * s, t.shape[-1]) for t in position_embeddings)
        # what the layer's attention receives besides q/k/v (the untiled layer passes these through)
        akw = dict(position_ids=position_ids, use_cache=use_cache, **kwargs)
        slots, params = _grad_params(self.layer)
        if grad and (x.requires_grad or params):
            return _TiledLayer.apply(self, (cos, sin, attention_mask, akw), slots, x, *params)
        with torch.no_grad():
            return _forward(self, x, cos, sin, attention_mask, akw)


def _tiles(plan: _LayerPlan, n: int):
    return _windows(n, plan.tile)


def _qkv(plan: _LayerPlan, x_flat, cos, sin):
    """q, k, v `[tokens, heads, d]`, computed tile by tile (no grad)."""
    bufs = None
    for start, keep, end in _tiles(plan, x_flat.shape[0]):
        outs = plan.pre(x_flat[start:end], cos[start:end], sin[start:end])
        if bufs is None:
            bufs = [t.new_empty((x_flat.shape[0], *t.shape[1:])) for t in outs]
        for buf, t in zip(bufs, outs):
            buf[keep:end] = t[keep - start:]
    return bufs


def _forward(plan: _LayerPlan, x, cos, sin, mask, akw):
    b, s, hid = x.shape
    flat = x.reshape(b * s, hid)
    q, k, v = _qkv(plan, flat, cos, sin)
    o = plan.attention(q, k, v, (b, s), mask, akw)
    del q, k, v
    y = torch.empty_like(flat)
    for start, keep, end in _tiles(plan, flat.shape[0]):
        y[keep:end] = plan.post(flat[start:end], o[start:end])[keep - start:]
    return y.view(b, s, hid)


class _TiledLayer(torch.autograd.Function):
    """y = layer(x) with only x (and the parameters) saved; see the module docstring."""

    @staticmethod
    def forward(ctx, plan, extra, slots, x, *params):
        cos, sin, mask, akw = extra
        with torch.no_grad():
            y = _forward(plan, x, cos, sin, mask, akw)
        ctx.save_for_backward(x, *params)
        ctx.plan, ctx.extra, ctx.slots = plan, extra, slots
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, *params = ctx.saved_tensors
        plan, (cos, sin, mask, akw) = ctx.plan, ctx.extra
        need_x, need_p = ctx.needs_input_grad[3], ctx.needs_input_grad[4:]
        b, s, hid = x.shape
        flat = x.reshape(b * s, hid)
        g_flat = grad_out.reshape(b * s, hid)
        leaves = [p.detach().requires_grad_(need) for p, need in zip(params, need_p)]
        wanted = [p for p, need in zip(leaves, need_p) if need]
        sums = _Sums(len(wanted))
        tiles = _tiles(plan, b * s)
        with torch.enable_grad(), _swapped(ctx.slots, leaves):
            # q, k, v again (no grad: their tiles are differentiated below), then the attention with grad, one
            # call per KV head and its query heads (attention is independent across them): the attention kernel's
            # own backward buffers (FlashAttention-2: a float32 dq accumulator, GQA-expanded dk/dv) then exist
            # for one group of heads at a time
            with torch.no_grad():
                q, k, v = _qkv(plan, flat, cos, sin)
            groups = []  # per KV head: (q_j, k_j, v_j) leaves (views of the buffers), attention output `[T, hq * d]`
            for qs, ks in plan.head_groups(q.shape[1], k.shape[1]):
                leaves_j = [t[:, sl].detach().requires_grad_() for t, sl in ((q, qs), (k, ks), (v, ks))]
                groups.append((leaves_j, plan.attention(*leaves_j, (b, s), mask, akw)))
            cols = [o_j.shape[1] for _, o_j in groups]
            # post, tile by tile: the residual part of dx (rows the tile owns) and the attention output's gradient.
            # A gradient handed down by the tiled layer above (nothing else holds it) becomes dx in place: each
            # tile's rows are read before they are written.
            reuse = is_exclusive(grad_out) and grad_out.is_contiguous() and grad_out.dtype == x.dtype
            dx_res = g_flat if reuse else torch.empty_like(flat)
            d_o = [torch.empty_like(o_j) for _, o_j in groups]
            for start, keep, end in tiles:
                x_t = flat[start:end].detach().requires_grad_()
                o_t = torch.cat([o_j.detach()[start:end] for _, o_j in groups], dim=1).requires_grad_()
                y_t = plan.post(x_t, o_t)
                gx, go, *gp = torch.autograd.grad(y_t, [x_t, o_t] + wanted, _padded(g_flat, start, keep, end),
                                                  allow_unused=True)
                dx_res[keep:end] = gx[keep - start:]
                for d_o_j, go_j in zip(d_o, go[keep - start:].split(cols, dim=1)):
                    d_o_j[keep:end] = go_j
                sums.add(gp)
            del x_t, o_t, y_t, go
            grads = []  # per group: dq_j, dk_j, dv_j
            while groups:
                leaves_j, o_j = groups.pop(0)
                grads.append(torch.autograd.grad(o_j, leaves_j, d_o.pop(0)))
                del leaves_j, o_j  # this group's attention output and its gradient go before the next group's
            del q, k, v
            # pre, tile by tile: x's gradient gets the residual part first, then the norm's (autograd's order
            # untiled: the residual add runs before the norm in backward)
            grad_x = dx_res if need_x else None  # each tile's rows are read (as the seed) before they are written
            for start, keep, end in tiles:
                x_t = flat[start:end].detach().requires_grad_()
                q_t, k_t, v_t = plan.pre(x_t, cos[start:end], sin[start:end])
                res = x_t.view_as(x_t)  # created last: its backward (the residual part) runs first
                gs = [torch.cat([_padded(g[i], start, keep, end) for g in grads], dim=1) for i in range(3)]
                gs.append(_padded(dx_res, start, keep, end))
                gx, *gp = torch.autograd.grad([q_t, k_t, v_t, res], [x_t] + wanted, gs, allow_unused=True)
                if grad_x is not None:  # need_x
                    grad_x[keep:end] = gx[keep - start:]
                sums.add(gp)
        it = iter(sums.sums)
        p_grads = [_cast(next(it), p.dtype) if need else None for p, need in zip(params, need_p)]
        return (None, None, None, hand_down(ctx, None if grad_x is None else grad_x.view(b, s, hid)), *p_grads)
