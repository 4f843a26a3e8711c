"""Rollout-vs-actor probability mismatch, the sanity metric verl logs as `training/rollout_probs_diff_*`.

After a correct weight sync the inference engine and the training actor must assign (almost) the same
probability to every sampled token; a stale or mis-mapped weight shows up as a large difference.
"""
from __future__ import annotations

import torch


def rollout_probs_diff(rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor,
                       response_mask: torch.Tensor) -> dict[str, float]:
    """Mean / max / std of |exp(rollout_logp) - exp(actor_logp)| over the response tokens (mask == 1)."""
    mask = response_mask.bool()
    rollout_probs = torch.exp(rollout_log_probs.detach().float())
    actor_probs = torch.exp(actor_log_probs.detach().float().to(rollout_probs.device))
    diff = (rollout_probs - actor_probs).abs()[mask.to(rollout_probs.device)]
    if diff.numel() == 0:
        return {"training/rollout_probs_diff_mean": 0.0, "training/rollout_probs_diff_max": 0.0,
                "training/rollout_probs_diff_std": 0.0}
    return {
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_std": diff.std(unbiased=False).item(),
    }
