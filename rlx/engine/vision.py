"""`actor_rollout_ref.actor.freeze_vision_tower`: the vision encoder of a vision-language policy is not trained.

As verl's FSDP worker does: after the model is built (and LoRA applied), the vision tower's parameters are set to not
require gradients, so the optimizer never steps them (rlx's AdamW holds only parameters that require gradients) and
their values stay those loaded; the language model trains as usual. verl looks for the tower at `model.visual`
(transformers >= 4.52) or `visual` (Qwen-VL); rlx also at `vision_tower` (Gemma 3, LLaVA-style models), the same
module under another name. A model without one (a text-only model) is trained whole, with one note on rank 0, as
verl prints "No vision tower found".
"""
from __future__ import annotations

import sys

from torch import nn

KEY = "actor_rollout_ref.actor.freeze_vision_tower"
NAMES = ("visual", "vision_tower")


def vision_tower(model: nn.Module) -> nn.Module | None:
    """The vision encoder of `model` (under `model.model` or `model`, named `visual` or `vision_tower`), or None."""
    for owner in (getattr(model, "model", None), model):
        for name in NAMES:
            tower = getattr(owner, name, None) if isinstance(owner, nn.Module) else None
            if isinstance(tower, nn.Module):
                return tower
    return None


def apply_freeze_vision_tower(model: nn.Module, enabled: bool, rank: int = 0) -> nn.Module | None:
    """Freeze `model`'s vision tower when `enabled`; returns the frozen tower (None: nothing frozen)."""
    if not enabled:
        return None
    tower = vision_tower(model)
    if tower is None:
        if rank == 0:
            print(f"rlx: note: {KEY}=True but {type(model).__name__} has no vision tower (no `visual` or "
                  f"`vision_tower` module): nothing to freeze, the whole model trains.", file=sys.stderr, flush=True)
        return None
    tower.requires_grad_(False)
    return tower
