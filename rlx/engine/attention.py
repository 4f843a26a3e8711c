"""Packed rows (remove padding): several sequences in one row, `position_ids` restarting at 0 for each. The
attention must not cross sequences; `cu_seq_lens` (`[n + 1]` int32 offsets) in the forward's kwargs tell it
where they start. With flash-attn installed (CUDA) transformers' varlen path reads them; otherwise
`rlx_packed_sdpa` (registered here) runs PyTorch's SDPA causally on each sequence of the row.

The per-sequence calls see a new query length almost every time. PyTorch's cuDNN attention backend (which it
prefers on Hopper) builds and caches an execution graph per shape, a millisecond or more of host time each, so a
batch of varied lengths runs CPU-bound with the GPU idle: 5-10x slower log-probs and updates on an H100. vLLM turns
that backend off process-wide when it is imported, so only a trainer without a vLLM engine in its process (the
rollout on GPUs of its own) met it. The packed path therefore asks for Flash, memory-efficient or math attention
(`packed_sdpa_backends`), never cuDNN.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

PACKED_SDPA = "rlx_packed_sdpa"


def packed_sdpa_backends() -> list:
    """SDPA backends of the per-sequence calls, in PyTorch's priority order: cuDNN left out (see the module doc)."""
    from torch.nn.attention import SDPBackend

    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention interface: causal SDPA on each packed sequence (`cu_seq_lens_q`), else plain SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    assert query.shape[0] == 1, "packed rows hold one row"
    groups = query.shape[1] // key.shape[1]
    bounds = cu.tolist()
    outs = []
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(packed_sdpa_backends()):
        for s, e in zip(bounds[:-1], bounds[1:]):
            k, v = key[:, :, s:e], value[:, :, s:e]
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            outs.append(F.scaled_dot_product_attention(query[:, :, s:e], k, v,
                                                       dropout_p=dropout if module.training else 0.0,
                                                       is_causal=True, scale=scaling))
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    return out.transpose(1, 2).contiguous(), None


def _packed_mask(*args, attention_mask=None, **kwargs):
    """transformers mask interface: no mask without a padding mask (a packed row: `_packed_sdpa` is causal per
    sequence; no [L, L] block mask is built from the restarting positions), else SDPA's mask."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register_packed_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, _packed_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, _packed_mask)


def packed_attn_implementation(device_type: str) -> str:
    """flash_attention_2 where flash-attn is installed on CUDA (its varlen kernel), else rlx's per-sequence SDPA."""
    if device_type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    register_packed_attention()
    return PACKED_SDPA
