"""Liger kernels (`model.use_liger`, verl's key): Triton RMSNorm, SwiGLU MLP and rotary embedding in the actor's,
the ref's and the critic's HF model, from the liger-kernel package.

`apply_liger(model, model_cfg, device, key)` patches the built (plain, unwrapped) HF model in place, before LoRA,
the token head, tiling and FSDP see it:

* RMSNorm (every decoder layer's two and the final norm) and the SwiGLU MLP: this model's module instances' forwards
  are Liger's (Liger's own swap of the family's classes is undone, so models built later are not affected), so whatever calls them later (the tiled MLP, the tiled decoder layer, the activation offload, peft's
  adapters inside the MLP's projections) runs the Liger kernels;
* RoPE: Liger replaces the model family's `apply_rotary_pos_emb` (a module-level function, so every model of that
  family in the process: the ref and the HF rollout of the same worker too; the same rotation). torch's function
  is kept on the module as `_rlx_torch_rotary` for the tiled decoder layers (`tile_layer_tokens`), which rotate
  `[tokens, heads, d]` tiles, a layout Liger's kernel does not take.

Liger's cross-entropy and fused linear cross-entropy stay off (as in verl): rlx's own head computes the log-probs
(`rlx.ops.log_prob_head`). Triton kernels need a GPU: `use_liger=True` on the CPU is refused by name.
"""
from __future__ import annotations

import importlib.util

import torch
from torch import nn


def apply_liger(model: nn.Module, use_liger: bool, device: torch.device, key: str) -> bool:
    """Patch `model` with Liger's RMSNorm, SwiGLU MLP and RoPE when `use_liger`; returns whether it did. `key` names
    the config key in errors."""
    if not use_liger:
        return False
    if device.type != "cuda":
        raise ValueError(f"{key}=True runs Liger's Triton kernels, which need a GPU (this engine is on "
                         f"{device.type}). Fix: {key}=False, or trainer.device=cuda.")
    if importlib.util.find_spec("liger_kernel") is None:
        raise ValueError(f"{key}=True needs the liger-kernel package. Fix: pip install liger-kernel (or "
                         f"pip install 'rlx[kernels]'), or {key}=False.")
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    model_type = getattr(model.config, "model_type", None)
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        raise ValueError(f"{key}=True: liger-kernel has no kernels for model_type={model_type!r} (it patches "
                         f"{sorted(MODEL_TYPE_TO_APPLY_LIGER_FN)}). Fix: {key}=False.")
    import inspect
    import sys

    family = sys.modules[type(model).__module__]  # e.g. transformers.models.qwen2.modeling_qwen2
    torch_rotary = getattr(family, "apply_rotary_pos_emb", None)
    if torch_rotary is not None and not hasattr(family, "_rlx_torch_rotary"):
        setattr(family, "_rlx_torch_rotary", torch_rotary)  # before Liger replaces it (the tiled layers keep using it)
    wanted = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False)
    takes = inspect.signature(apply).parameters  # a family without a key (e.g. no SwiGLU MLP) has no kernel for it
    # Liger also swaps the family's module classes (Qwen2RMSNorm, Qwen2MLP, ...) for every model built later in this
    # process; rlx patches this model's module instances only (the ref, a reward model or another engine of the same
    # process keep torch's norms and MLPs unless their own use_liger says otherwise)
    classes = {name: value for name, value in vars(family).items() if isinstance(value, type)}
    apply(model=model, **{k: v for k, v in wanted.items() if k in takes})
    for name, value in classes.items():
        setattr(family, name, value)
    return True
