"""Packed rows (remove padding): several sequences in one row, `position_ids` restarting at 0 for each. The
attention must not cross sequences; `cu_seq_lens` (`[n + 1]` int32 offsets) and the longest sequence
(`max_length_q`) in the forward's kwargs tell it where they start. Three kernels, chosen once per process by what
the machine has (`packed_kernel`, logged once):

- `flash-attn`: transformers' own `flash_attention_2` varlen path, where the flash-attn package is installed (CUDA).
- `varlen`: PyTorch's own varlen kernel, `torch.nn.attention.varlen.varlen_attn` (its Flash kernel, with backward),
  on CUDA GPUs of compute capability 8.0 or more with a torch that has it (2.10+). One call for the whole row,
  causal per sequence (`window_size=(-1, 0)`); key and value heads repeated for GQA where the torch has no
  `enable_gqa`. Registered as `rlx_packed_varlen`. Half precision only: a float32 model takes the per-sequence
  path below (said once).
- `sdpa-per-sequence`: PyTorch's SDPA, one causal call per sequence of the row (CPU, older torch or GPUs).
  Registered as `rlx_packed_sdpa`.

The per-sequence calls see a new query length almost every time. PyTorch's cuDNN attention backend (which it
prefers on Hopper) builds and caches an execution graph per shape, a millisecond or more of host time each, so a
batch of varied lengths runs CPU-bound with the GPU idle. vLLM turns that backend off process-wide when it is
imported, so only a trainer without a vLLM engine in its process met it. The per-sequence path therefore asks for
Flash, memory-efficient or math attention (`packed_sdpa_backends`), never cuDNN.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger("rlx")

PACKED_SDPA = "rlx_packed_sdpa"
PACKED_VARLEN = "rlx_packed_varlen"
_HALF = (torch.float16, torch.bfloat16)


def packed_sdpa_backends() -> list:
    """SDPA backends of the per-sequence calls, in PyTorch's priority order: cuDNN left out (see the module doc)."""
    from torch.nn.attention import SDPBackend

    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@functools.lru_cache(maxsize=None)
def _varlen_fn():
    """torch's `varlen_attn` and whether it takes `enable_gqa`, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, "enable_gqa" in inspect.signature(varlen_attn).parameters


@functools.lru_cache(maxsize=None)
def packed_kernel(device_type: str) -> str:
    """The packed-row kernel on this machine: "flash-attn", "varlen" or "sdpa-per-sequence" (module docstring).
    Decided once per device type, by capability, and logged once."""
    if device_type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        kernel, why = "flash-attn", "the flash-attn package is installed"
    elif device_type == "cuda" and _varlen_fn() is None:
        kernel, why = "sdpa-per-sequence", f"torch {torch.__version__} has no torch.nn.attention.varlen"
    elif device_type == "cuda" and torch.cuda.get_device_capability() < (8, 0):
        kernel, why = "sdpa-per-sequence", f"compute capability {torch.cuda.get_device_capability()} < (8, 0)"
    elif device_type == "cuda":
        kernel, why = "varlen", f"torch {torch.__version__}'s varlen_attn on {torch.cuda.get_device_name()}"
    else:
        kernel, why = "sdpa-per-sequence", f"no varlen kernel on {device_type}"
    log.info("rlx: packed attention (remove padding): %s (%s)", kernel, why)
    return kernel


@functools.lru_cache(maxsize=None)
def _say_float32_once(dtype) -> None:
    log.info("rlx: packed attention: the varlen kernel takes half precision only; %s runs SDPA per sequence", dtype)


def _per_sequence(query, key, value, cu: torch.Tensor, dropout: float, scaling) -> torch.Tensor:
    """Causal SDPA on each sequence: q `[1, h, T, d]`, k/v `[1, kv_h, T, d]` -> `[1, T, h, d]`."""
    from torch.nn.attention import sdpa_kernel

    groups = query.shape[1] // key.shape[1]
    bounds = cu.tolist()
    outs = []
    with sdpa_kernel(packed_sdpa_backends()):
        for s, e in zip(bounds[:-1], bounds[1:]):
            k, v = key[:, :, s:e], value[:, :, s:e]
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            outs.append(F.scaled_dot_product_attention(query[:, :, s:e], k, v, dropout_p=dropout, is_causal=True,
                                                       scale=scaling))
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    return out.transpose(1, 2).contiguous()


def _varlen(query, key, value, cu: torch.Tensor, longest: int, scaling) -> torch.Tensor:
    """One varlen_attn call for the whole row: q `[1, h, T, d]`, k/v `[1, kv_h, T, d]` -> `[1, T, h, d]`."""
    fn, takes_gqa = _varlen_fn()
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, heads, d]
    extra = {}
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and takes_gqa:
        extra["enable_gqa"] = True
    elif groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    cu = cu.to(device=q.device, dtype=torch.int32)
    out = fn(q, k, v, cu, cu, longest, longest, scale=scaling, window_size=(-1, 0), **extra)
    return out.unsqueeze(0)


def packed_attention(query, key, value, cu_seq_lens: torch.Tensor, longest: int | None, dropout: float = 0.0,
                     scaling=None, kernel: str = "sdpa-per-sequence") -> torch.Tensor:
    """Causal attention within each sequence of one packed row, by `kernel` ("varlen" or "sdpa-per-sequence"; the
    flash-attn package is reached through transformers or `rlx.engine.ulysses`): q `[1, h, T, d]`, k/v
    `[1, kv_h, T, d]` -> `[1, T, h, d]`. The varlen kernel has no dropout: a dropout > 0 runs per sequence."""
    assert query.shape[0] == 1, "packed rows hold one row"
    if kernel == "varlen" and query.dtype in _HALF and dropout == 0.0:
        if longest is None:
            longest = int((cu_seq_lens[1:] - cu_seq_lens[:-1]).max())
        return _varlen(query, key, value, cu_seq_lens, int(longest), scaling)
    if kernel == "varlen" and query.dtype not in _HALF:
        _say_float32_once(query.dtype)
    return _per_sequence(query, key, value, cu_seq_lens, dropout, scaling)


def _interface(kernel: str):
    """A transformers attention interface for packed rows (`cu_seq_lens_q` in kwargs), else plain SDPA."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        cu = kwargs.get("cu_seq_lens_q")
        if cu is None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, is_causal=is_causal, **kwargs)
        out = packed_attention(query, key, value, cu, kwargs.get("max_length_q"),
                               dropout if module.training else 0.0, scaling, kernel)
        return out, None

    return attention


_packed_sdpa = _interface("sdpa-per-sequence")
_packed_varlen = _interface("varlen")


def _packed_mask(*args, attention_mask=None, **kwargs):
    """transformers mask interface: no mask without a padding mask (a packed row: the kernels are causal per
    sequence; no [L, L] block mask is built from the restarting positions), else SDPA's mask."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    kwargs["attention_mask"] = attention_mask
    return sdpa_mask(*args, **kwargs)


def register_packed_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, fn in ((PACKED_SDPA, _packed_sdpa), (PACKED_VARLEN, _packed_varlen)):
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, _packed_mask)


def packed_attn_implementation(device_type: str) -> str:
    """The `attn_implementation` of a remove-padding model on `device_type`: `flash_attention_2` where flash-attn is
    installed (CUDA), `rlx_packed_varlen` where torch's varlen kernel runs, else `rlx_packed_sdpa`."""
    kernel = packed_kernel(device_type)
    if kernel == "flash-attn":
        return "flash_attention_2"
    register_packed_attention()
    return PACKED_VARLEN if kernel == "varlen" else PACKED_SDPA
