"""Patching a module's forward with a way back (the tiled ops and the activation offload patch modules in place)."""
from __future__ import annotations

from typing import Callable

from torch import nn


def patch_forward(module: nn.Module, forward: Callable) -> Callable[[], None]:
    """Set `module.forward` (an instance attribute) to `forward`; returns the function that restores what was
    there (the instance's own forward, or none: the class's)."""
    had, orig = "forward" in module.__dict__, module.__dict__.get("forward")
    module.forward = forward

    def undo():
        if had:
            module.__dict__["forward"] = orig  # what setting the instance attribute did
        else:
            del module.forward

    return undo
