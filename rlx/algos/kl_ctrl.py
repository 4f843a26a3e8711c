"""The coefficient of the in-reward KL penalty (`algorithm.kl_ctrl`): fixed, or adaptive (Ziegler et al. 2019)."""
from __future__ import annotations

from typing import Optional

import numpy as np

KL_CTRL_TYPES = ("fixed", "adaptive")


class FixedKLController:
    """Constant KL coefficient; ``update`` is a no-op."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        return None


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019 (https://arxiv.org/abs/1909.08593).

    ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``; ``value *= 1 + e * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if not horizon > 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0, got {horizon}")
        if not target_kl > 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def get_kl_controller(type: str, kl_coef: float, target_kl: Optional[float] = None,
                      horizon: Optional[float] = None):
    """Build the controller named by ``algorithm.kl_ctrl.type`` ("fixed" or "adaptive")."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("algorithm.kl_ctrl.type=adaptive needs algorithm.kl_ctrl.target_kl and .horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"Unknown algorithm.kl_ctrl.type={type!r}; valid choices: {list(KL_CTRL_TYPES)}")
