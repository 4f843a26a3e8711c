"""Ulysses sequence parallelism (DeepSpeed-Ulysses, verl's `ulysses_sequence_parallel_size`) for packed rows.

The data-parallel world splits into groups of `sp` consecutive ranks. The ranks of a group get the same
micro-batch, packed into one row (remove padding) and padded to a multiple of `sp` tokens; each rank holds one
contiguous 1/sp of that row (`shard_packed`) and runs everything token-local on it: embeddings, norms,
projections, rotary (its positions travel with its tokens), the MLP and the head. Attention needs every token:

    q, k, v  [1, heads, tokens/sp, d]  --all-to-all-->  [1, heads/sp, tokens, d]   (heads scattered, tokens gathered)
    attention over the whole packed row (causal per sequence, the row's global cu_seqlens) on heads/sp heads
    out      [1, tokens, heads/sp, d]  --all-to-all-->  [1, tokens/sp, heads, d]

With fewer KV heads than `sp` (GQA), each KV head is repeated `sp / kv_heads` times before the all-to-all, so
every rank gets the KV head of its query heads (query head h reads KV head h // (heads / kv_heads) before and
after the repeat). The head's per-token outputs (log-prob, entropy, value) are computed on the local slice,
written into a `[tokens/sp]` vector, all-gathered over the group to `[tokens]` and picked at the scored
positions, so every rank of the group ends with the same per-token outputs in the original order.

Gradients. Every rank of a group computes the same loss from the same gathered outputs; the gather's backward
keeps the gradient of the rank's own slice (no sum over the group: the other ranks backpropagate their own
slices of the same loss), the all-to-all's backward is the inverse all-to-all. A parameter's gradient summed
over the group is therefore the micro-batch's gradient once; FSDP then averages over all ranks, so the loss
normaliser divides by the number of ranks and counts each token once (over data-parallel groups, not over the
ranks of a group): see `FSDPEngine.run_update`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

ULYSSES_ATTENTION = "rlx_ulysses"

_GROUPS: dict[int, Optional[dist.ProcessGroup]] = {}


def sp_group(sp: int) -> Optional[dist.ProcessGroup]:
    """This rank's sequence-parallel group: ranks [k*sp, (k+1)*sp) of the default group (None for sp=1).

    Collective: every rank must call it with the same `sp` (it creates all groups of that size, in order)."""
    if sp == 1:
        return None
    if sp not in _GROUPS:
        world, rank = dist.get_world_size(), dist.get_rank()
        assert world % sp == 0, f"world size {world} is not a multiple of the sequence-parallel size {sp}"
        mine = None
        for start in range(0, world, sp):
            g = dist.new_group(list(range(start, start + sp)))
            if start <= rank < start + sp:
                mine = g
        _GROUPS[sp] = mine
    return _GROUPS[sp]


# ---- collectives with their gradients --------------------------------------------------------------------------
def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Split `x` in `sp` chunks along `scatter_dim`, send chunk j to rank j, concatenate what arrives (in rank
    order) along `gather_dim`."""
    sp = dist.get_world_size(group)
    send = torch.stack(x.chunk(sp, dim=scatter_dim), 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Differentiable all-to-all over `group` (its backward is the inverse all-to-all)."""
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


# torch 2.13 renames all_gather_into_tensor (deprecated there); 2.11 has only the old name
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _GatherSlices(torch.autograd.Function):
    """Concatenate each rank's `[n, ...]` slice (equal sizes) in rank order; backward keeps the own slice's
    gradient (every rank of the group computes the same loss from the gathered tensor)."""

    @staticmethod
    def forward(ctx, x, group):
        sp, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.group, ctx.rank, ctx.n = group, rank, x.shape[0]
        out = torch.empty((sp * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        _all_gather_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n].contiguous(), None


def gather_scored(local: torch.Tensor, local_index: torch.Tensor, local_len: int, index: torch.Tensor,
                  group) -> torch.Tensor:
    """Per-token outputs of the group's packed row at its scored positions, in their original order.

    `local` `[n_local]`: this rank's outputs at `local_index` (positions within its slice of `local_len`
    tokens); `index` `[N]`: the scored positions in the whole (padded) row. Only `[tokens]` vectors travel."""
    slot = local.new_zeros(local_len).index_put((local_index,), local)
    return _GatherSlices.apply(slot, group).index_select(0, index)


# ---- attention -----------------------------------------------------------------------------------------------
def _inner_attention(module, q, k, v, dropout: float, scaling, cu_seq_lens: torch.Tensor, longest: int):
    """Causal attention per packed sequence over the whole row: q/k/v `[1, h, tokens, d]` -> `[1, tokens, h, d]`,
    by the machine's packed kernel (`rlx.engine.attention.packed_kernel`): flash-attn's varlen function where
    installed (CUDA, half precision), torch's varlen kernel, else PyTorch SDPA per sequence."""
    from rlx.engine.attention import packed_attention, packed_kernel

    kernel = packed_kernel(q.device.type)
    if kernel == "flash-attn" and q.dtype in (torch.float16, torch.bfloat16):
        from flash_attn import flash_attn_varlen_func

        cu = cu_seq_lens.to(device=q.device, dtype=torch.int32)
        out = flash_attn_varlen_func(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu,
                                     longest, longest, dropout_p=dropout, softmax_scale=scaling, causal=True)
        return out.unsqueeze(0)
    return packed_attention(q, k, v, cu_seq_lens, longest, dropout, scaling,
                            "varlen" if kernel == "varlen" else "sdpa-per-sequence")


def ulysses_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention interface (registered as `rlx_ulysses`): see the module docstring.

    query `[1, heads, tokens/sp, d]`, key/value `[1, kv_heads, tokens/sp, d]`; kwargs carry the whole row's
    `cu_seq_lens_q` and `max_length_q`. Returns `([1, tokens/sp, heads, d], None)`."""
    group = module._rlx_sp_group
    sp = dist.get_world_size(group)
    kv_heads = key.shape[1]
    if kv_heads < sp:  # GQA: one KV head per rank at least, each query head still meets its own KV head
        key = key.repeat_interleave(sp // kv_heads, dim=1)
        value = value.repeat_interleave(sp // kv_heads, dim=1)
    q, k, v = (all_to_all(t, group, scatter_dim=1, gather_dim=2) for t in (query, key, value))
    out = _inner_attention(module, q, k, v, dropout if module.training else 0.0, scaling, kwargs["cu_seq_lens_q"],
                           int(kwargs["max_length_q"]))
    return all_to_all(out, group, scatter_dim=1, gather_dim=2), None


def register_ulysses_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ULYSSES_ATTENTION, ulysses_attention)
    AttentionMaskInterface.register(ULYSSES_ATTENTION, sdpa_mask)


def check_heads(config, sp: int, key: str) -> None:
    """ValueError unless `sp` splits the model's attention heads (and its KV heads, or repeats them evenly)."""
    from rlx.config.model import sp_heads_problem

    problem = sp_heads_problem(key, sp, config.num_attention_heads, getattr(config, "num_key_value_heads", None),
                               f"model_type={getattr(config, 'model_type', '?')}")
    if problem:
        raise ValueError(problem)


def apply_ulysses(model: nn.Module, group) -> None:
    """Point every decoder layer's attention at `group` (call before FSDP wraps the model; the model is built
    with `attn_implementation="rlx_ulysses"`)."""
    from rlx.offload import find_decoder_layers

    for i, layer in enumerate(find_decoder_layers(model)):
        attn = getattr(layer, "self_attn", None)
        if not isinstance(attn, nn.Module):
            raise ValueError(f"Ulysses sequence parallelism: decoder layer {i} ({type(layer).__name__}) has no "
                             f"`self_attn` module; it supports HF decoders with one (Qwen2, Llama, ...).")
        attn._rlx_sp_group = group
    model._rlx_sp_group = group


def shard_packed(input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seq_lens: torch.Tensor,
                 index: torch.Tensor, targets: torch.Tensor, rank: int, sp: int) -> dict:
    """This rank's slice of one packed row (`input_ids`/`position_ids` `[1, T]`), padded to a multiple of `sp`.

    The padding is a sequence of its own at the end (positions 0.., its own cu_seqlens entry), so it attends
    only to itself and no real token attends to it. Returns the model kwargs: the slice's ids and positions,
    the whole row's `cu_seq_lens`, the scored positions inside the slice (`index`) and their `targets`, and
    `sp_index`, the scored positions in the whole row (where `gather_scored` picks the outputs)."""
    total = input_ids.shape[1]
    pad = (-total) % sp
    if pad:
        input_ids = torch.cat([input_ids, input_ids.new_zeros((1, pad))], 1)
        position_ids = torch.cat([position_ids, torch.arange(pad, dtype=position_ids.dtype).unsqueeze(0)], 1)
        cu_seq_lens = torch.cat([cu_seq_lens, cu_seq_lens.new_tensor([total + pad])])
    n = (total + pad) // sp
    start, end = rank * n, (rank + 1) * n
    mine = (index >= start) & (index < end)
    return dict(input_ids=input_ids[:, start:end], position_ids=position_ids[:, start:end], attention_mask=None,
                cu_seq_lens=cu_seq_lens, index=index[mine] - start, targets=targets[mine], sp_index=index)
