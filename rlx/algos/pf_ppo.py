"""Policy Filtration for PPO (Zhang et al. 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation"),
as verl's `algorithm.use_pf_ppo`: the batch is drawn again with replacement, response i with probability
proportional to a weight of its score s_i (the sum of its token scores), so that responses with reliable rewards
are trained on more often.
"""
from __future__ import annotations

import torch

REWEIGHT_METHODS = ("pow", "max_min", "max_random")
WEIGHT_FLOOR = 1e-8  # added to every weight (and the minimum), so that no draw has all-zero weights


@torch.no_grad()
def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """Each response's weight: pow |s|^weight_pow; max_min 1 at the batch's highest and lowest s, else 0;
    max_random 0.4 at the highest s, else 0.1; then + 1e-8 (at least 1e-8)."""
    if method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={method!r}; use one of {list(REWEIGHT_METHODS)}")
    return (weights + WEIGHT_FLOOR).clamp(min=WEIGHT_FLOOR)


def resample_indices(scores: torch.Tensor, method: str, weight_pow: float,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """As many row indices as rows, drawn with replacement in proportion to `pf_ppo_weights`."""
    weights = pf_ppo_weights(scores.float(), method, weight_pow)
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)
