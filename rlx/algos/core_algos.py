"""Core PPO / GRPO / RLOO math as pure tensor functions.

Everything here is side-effect free (apart from the KL controllers, which carry one float of state)
and depends only on ``torch`` and ``numpy``: no Ray, no Hydra, no distributed state. The function
names, argument orders and numerical semantics follow verl's ``core_algos`` so that configs and
reference numbers carry over.

Conventions
-----------
* Token-level tensors are ``[B, T]`` over *response* tokens only.
* ``response_mask`` is 0/1 (float, int or bool); positions where it is 0 (padding after EOS, or
  observation tokens in multi-turn rollouts) never contribute to a statistic or a loss.
* Masked reductions select with ``torch.where`` instead of multiplying, so a NaN/Inf sitting at a
  masked position cannot leak into the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

# what used to live here, in modules of their own (these names stay importable from this module)
from rlx.algos.kl_ctrl import (AdaptiveKLController, FixedKLController, KL_CTRL_TYPES,  # noqa: F401
                               get_kl_controller)
from rlx.algos.logits import entropy_from_logits, logprobs_from_logits, sum_pi_squared_from_logits  # noqa: F401

__all__ = [
    "ADV_ESTIMATORS",
    "LOSS_AGG_MODES",
    "KL_PENALTY_TYPES",
    "KL_CTRL_TYPES",
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "GlobalBatchInfo",
    "agg_loss",
    "compute_policy_loss",
    "compute_value_loss",
    "compute_entropy_loss",
    "kl_penalty",
    "entropy_from_logits",
    "logprobs_from_logits",
    "sum_pi_squared_from_logits",
    "FixedKLController",
    "AdaptiveKLController",
    "get_kl_controller",
    "apply_kl_penalty",
]

ADV_ESTIMATORS = ("gae", "grpo", "rloo")
"""The estimators defined in this module; `rlx.algos.advantages.ADV_ESTIMATORS` has every one rlx accepts."""
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_BASE_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_PENALTY_TYPES = KL_BASE_TYPES + tuple(f"{k}+" for k in KL_BASE_TYPES)
"""Each estimator, and its `+` form: the estimator's value with the gradient of k2 (straight through)."""


# ---------------------------------------------------------------------------------------------------
# masked statistics
# ---------------------------------------------------------------------------------------------------
def _as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum of ``x`` over positions where ``mask`` is non-zero (over everything if ``dim`` is None)."""
    m = _as_bool_mask(mask)
    vals = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return vals.sum() if dim is None else vals.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is non-zero.

    ``dim=None`` reduces over all elements and returns a scalar tensor; an int/tuple reduces over
    those dimensions. A reduction with no valid position returns 0 rather than NaN.
    """
    m = _as_bool_mask(mask)
    total = masked_sum(x, m, dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over the valid positions of ``mask`` (a scalar over all elements).

    With ``unbiased=True`` Bessel's correction ``n / (n - 1)`` is applied, as in verl; this needs at
    least two valid elements and raises ``ValueError`` otherwise.
    """
    m = _as_bool_mask(mask)
    mean = masked_mean(x, m)
    var = masked_mean((x - mean) ** 2, m)
    if unbiased:
        n = int(m.sum().item())
        if n == 0:
            raise ValueError("masked_var: the mask selects no element")
        if n == 1:
            raise ValueError("masked_var: the mask selects a single element; unbiased variance is undefined")
        var = var * (n / (n - 1))
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to zero mean / unit variance using statistics of the valid positions only.

    ``(x - mean) / sqrt(var + 1e-8)`` with the unbiased masked variance. With ``shift_mean=False``
    the mean is added back (only the scale is normalised). Masked positions are transformed too
    (their values are not meaningful), exactly as in verl.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# ---------------------------------------------------------------------------------------------------
# advantage estimators
# ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015) over response tokens.

    Runs the backward recursion ``delta_t = r_t + gamma * V_next - V_t``,
    ``A_t = delta_t + gamma * lam * A_next``, where ``V_next`` / ``A_next`` refer to the next *valid*
    token: masked positions are skipped (they pass the running value and advantage through
    unchanged), so rewards or values sitting on masked positions never reach a valid token. After the
    last valid token the bootstrap value is 0.

    Returns ``(advantages, returns)``, both ``[B, T]``: ``returns = A + V`` computed from the raw
    advantages, then ``advantages`` are whitened over the valid tokens of the whole batch.
    """
    m = _as_bool_mask(response_mask)
    rewards = token_level_rewards
    B, T = rewards.shape
    zero = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    next_value = zero
    last_gae = zero
    adv_reversed = []
    for t in reversed(range(T)):
        valid = m[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        next_value = torch.where(valid, values[:, t], next_value)
        last_gae = torch.where(valid, gae_t, last_gae)
        adv_reversed.append(last_gae)
    advantages = torch.stack(adv_reversed[::-1], dim=1)
    returns = advantages + values
    advantages = masked_whiten(advantages, m)
    return advantages, returns


def _group_ids(index: Any, batch_size: int) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group labels (uids) to dense ints ``0..G-1`` in first-seen order."""
    labels = index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else list(index)
    if len(labels) != batch_size:
        raise ValueError(f"index has {len(labels)} entries but the batch has {batch_size} rows")
    mapping: dict[Any, int] = {}
    ids = [mapping.setdefault(label, len(mapping)) for label in labels]
    return torch.tensor(ids, dtype=torch.long), len(mapping)


def _group_stats(scores: torch.Tensor, index: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group size, group sum and unbiased group std (rows of 1-element groups get std 0)."""
    ids, n_groups = _group_ids(index, scores.shape[0])
    ids = ids.to(scores.device)
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    total = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, scores)
    mean = total / count
    sq = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, (scores - mean[ids]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return count[ids], total[ids], std[ids]


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024).

    Each response's score is the sum of its token rewards. Within a group (rows sharing the same
    ``index`` label, i.e. the same prompt uid) the advantage is ``(score - mean) / (std + epsilon)``
    with the unbiased std; with ``norm_adv_by_std_in_grpo=False`` it is ``score - mean`` (Dr. GRPO).
    A group of a single response uses mean 0 and std 1 (so its advantage is its raw score), as verl.
    The scalar is broadcast over the valid tokens; returns equal advantages.
    """
    scores = token_level_rewards.sum(dim=-1)
    count, total, std = _group_stats(scores, index)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(total), total / count)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    m = _as_bool_mask(response_mask)
    adv = torch.where(m, adv.unsqueeze(-1), torch.zeros((), dtype=adv.dtype, device=adv.device))
    return adv, adv


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO outcome advantage (Ahmadian et al. 2024): score minus the mean of the *other* responses.

    For a group of ``n > 1`` responses ``A_i = s_i - (sum_j s_j - s_i) / (n - 1)``; a response that is
    alone in its group keeps its raw score (as verl). ``epsilon`` is accepted for signature
    compatibility and unused. Broadcast over the valid tokens; returns equal advantages.
    """
    del epsilon
    scores = token_level_rewards.sum(dim=-1)
    count, total, _ = _group_stats(scores, index)
    loo_baseline = (total - scores) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, scores - loo_baseline, scores)
    m = _as_bool_mask(response_mask)
    adv = torch.where(m, adv.unsqueeze(-1), torch.zeros((), dtype=adv.dtype, device=adv.device))
    return adv, adv


# ---------------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GlobalBatchInfo:
    """What a micro-batch's loss is normalised by, so that the micro-batches of a mini-batch, on every data-parallel
    rank, add up to the mini-batch's loss (verl's ``global_batch_info``; the engine fills it per mini-batch).

    FSDP averages gradients over ``dp_size`` ranks, so each rank multiplies its share by ``dp_size``. ``None``
    counts: the micro-batch is the whole batch (the function-level default, as in verl)."""

    dp_size: int = 1
    """Ranks whose gradients are averaged."""
    batch_num_tokens: Optional[float] = None
    """Valid tokens of the whole mini-batch, over every rank (token-mean)."""
    global_batch_size: Optional[float] = None
    """Rows of the whole mini-batch, over every rank, fully masked rows included (the seq-mean-* modes)."""
    loss_scale_factor: Optional[float] = None
    """``actor.loss_scale_factor``: the divisor of seq-mean-token-sum-norm (None: the response length)."""

    def kwargs(self) -> dict:
        """The keyword arguments of ``agg_loss`` (and of the losses that take them, as verl's do)."""
        return dict(dp_size=self.dp_size, batch_num_tokens=self.batch_num_tokens,
                    global_batch_size=self.global_batch_size, loss_scale_factor=self.loss_scale_factor)

    def agg(self, loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
        """``agg_loss`` of this micro-batch with these global counts."""
        return agg_loss(loss_mat, loss_mask, loss_agg_mode, **self.kwargs())


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, dp_size: int = 1,
             batch_num_tokens: Optional[float] = None, global_batch_size: Optional[float] = None,
             loss_scale_factor: Optional[float] = None) -> torch.Tensor:
    """Reduce a ``[B, T]`` loss matrix to a scalar according to ``actor.loss_agg_mode`` (verl's modes).

    * ``token-mean``: sum over valid tokens / ``batch_num_tokens`` (default: this batch's valid tokens).
    * ``token-sum``: sum over valid tokens (no normalisation).
    * ``seq-mean-token-sum``: per-sequence sum over valid tokens, summed over the sequences, / ``global_batch_size``.
    * ``seq-mean-token-mean``: per-sequence mean over valid tokens, summed, / ``global_batch_size``.
    * ``seq-mean-token-sum-norm``: seq-mean-token-sum / ``loss_scale_factor`` (default: ``T``, the padded
      response length): Dr. GRPO's constant normaliser (Liu et al. 2025, "Understanding R1-Zero-Like Training",
      https://arxiv.org/abs/2503.20783), which removes the length bias of per-sequence means.

    ``global_batch_size`` defaults to this batch's sequences with at least one valid token. The trainer passes the
    mini-batch's row count, fully masked rows included (verl's trainer: ``ppo_mini_batch_size * rollout.n``), so a
    fully masked row counts as a sequence of loss 0. Every mode is multiplied by ``dp_size`` (see
    ``GlobalBatchInfo``). A batch with nothing to average over gives 0.
    """
    m = _as_bool_mask(loss_mask)
    if loss_agg_mode in ("token-mean", "token-sum"):
        total = masked_sum(loss_mat, m)
        if loss_agg_mode == "token-mean":
            count = m.sum() if batch_num_tokens is None else batch_num_tokens
            total = total / _positive(count, total)
        return total * dp_size
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"Unknown actor.loss_agg_mode={loss_agg_mode!r}; valid choices: {list(LOSS_AGG_MODES)}")
    seq_losses = masked_sum(loss_mat, m, dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / _positive(m.sum(dim=-1), seq_losses)
    has_tokens = m.any(dim=-1)
    rows = has_tokens.sum() if global_batch_size is None else global_batch_size
    loss = masked_sum(seq_losses, has_tokens) / _positive(rows, seq_losses) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (m.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def _positive(count, like: torch.Tensor):
    """``count`` (a tensor or a number) as a divisor: at least 1 where nothing is counted (0 / 1 = 0, not NaN)."""
    if isinstance(count, torch.Tensor):
        return count.clamp(min=1).to(like.dtype)
    return count if count > 0 else 1


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float = 0.2,
    cliprange_low: Optional[float] = None,
    cliprange_high: Optional[float] = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_batch: Optional[GlobalBatchInfo] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with asymmetric clipping (DAPO clip-higher) and dual clip.

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    per token ``L = max(-A * ratio, -A * clip(ratio, 1 - cliprange_low, 1 + cliprange_high))``, and for
    negative advantages additionally ``L = min(L, -A * clip_ratio_c)`` (dual-clip PPO, Ye et al. 2019),
    which bounds the loss when the ratio explodes on a bad action. ``cliprange_low`` /
    ``cliprange_high`` default to ``cliprange``.

    Returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the aggregated loss, the fraction of
    valid tokens where the clipped term was active, the mean ``old_log_prob - log_prob`` over valid
    tokens, and the fraction of valid tokens where the dual clip bound was active. The three metrics
    are detached. ``rollout_is_weights`` (algorithm.rollout_correction) multiply each token's loss.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"actor.clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}")
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange
    m = _as_bool_mask(response_mask)

    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_approx_kl)
    ppo_kl = masked_mean(-neg_approx_kl, m)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange_low, 1.0 + cliprange_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    pg_clipfrac = masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), m)

    loss_dual_bound = -advantages * clip_ratio_c
    dual_clip_loss = torch.minimum(clip_loss, loss_dual_bound)
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean(((clip_loss > loss_dual_bound) & negative).to(ratio.dtype), m)

    pg_losses = torch.where(negative, dual_clip_loss, clip_loss)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = (global_batch or GlobalBatchInfo()).agg(pg_losses, m, loss_agg_mode)
    return pg_loss, pg_clipfrac.detach(), ppo_kl.detach(), pg_clipfrac_lower.detach()


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
    loss_scale_factor: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ``0.5 * agg(max((v - R)^2, (clip(v, V_old - c, V_old + c) - R)^2))``.

    The aggregation's global counts are ``agg_loss``'s (``GlobalBatchInfo.kwargs()``). Returns
    ``(vf_loss, vf_clipfrac)`` where ``vf_clipfrac`` (detached) is the fraction of valid tokens
    on which the clipped error was strictly larger.
    """
    m = _as_bool_mask(response_mask)
    vpred_clipped = torch.maximum(torch.minimum(vpreds, values + cliprange_value), values - cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), m, loss_agg_mode, dp_size=dp_size,
                             batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
                             loss_scale_factor=loss_scale_factor)
    vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).to(vpreds.dtype), m)
    return vf_loss, vf_clipfrac.detach()


def kl_penalty(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    kl_penalty: str,
    *,
    key: str = "algorithm.kl_penalty",
) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (see J. Schulman, "Approximating KL
    divergence", 2020).

    * ``kl`` / ``k1``: ``logprob - ref_logprob``
    * ``abs``: ``|logprob - ref_logprob|``
    * ``mse`` / ``k2``: ``0.5 * (logprob - ref_logprob)^2``
    * ``low_var_kl`` / ``k3``: ``exp(ref - logprob) - (ref - logprob) - 1`` with the log-ratio clamped
      to [-20, 20] before ``exp`` and the result clamped to [-10, 10].

    * a ``+`` form (``k1+``, ``low_var_kl+``, ...): the estimator's value with the gradient of ``k2``, through
      ``k2 - sg(k2) + sg(estimate)`` (straight through). k1 and k3 estimate the KL's value without bias but not its
      gradient; k2's gradient is the unbiased one (verl's ``+`` forms). ``k2+`` / ``mse+`` are ``k2``.

    ``key`` only names the config entry in the error raised for an unknown type
    (``actor_rollout_ref.actor.kl_loss_type`` or ``algorithm.kl_penalty``).
    """
    if kl_penalty not in KL_PENALTY_TYPES:
        raise ValueError(f"Unknown {key}={kl_penalty!r}; valid choices: {list(KL_PENALTY_TYPES)}")
    straight_through = kl_penalty.endswith("+")
    kind = kl_penalty.rstrip("+")
    if kind in ("kl", "k1"):
        value = logprob - ref_logprob
    elif kind == "abs":
        value = (logprob - ref_logprob).abs()
    elif kind in ("mse", "k2"):
        value = 0.5 * (logprob - ref_logprob).square()
    else:  # low_var_kl / k3
        log_ratio = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
        kld = torch.exp(log_ratio) - log_ratio - 1.0
        value = torch.clamp(kld, min=-10.0, max=10.0)
    if not straight_through or kind in ("mse", "k2"):
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


def compute_entropy_loss(logits: torch.Tensor, response_mask: torch.Tensor,
                         loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """Aggregated token entropy of ``logits`` ``[B, T, V]`` over ``response_mask``."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Fold a KL penalty into the rewards: ``rewards = scores - beta * kl * mask`` (``beta = kl_ctrl.value``).

    The batch KL is the mean over sequences of the per-sequence masked-mean KL; the controller is then
    updated with it and ``n_steps = B``. Metrics report that KL and the coefficient *used* (before the
    update): ``actor/reward_kl_penalty``, ``actor/reward_kl_penalty_coeff``.
    """
    m = _as_bool_mask(response_mask)
    kld = kl_penalty(old_log_probs, ref_log_prob, kl_penalty_type, key="algorithm.kl_penalty")
    kld = torch.where(m, kld, torch.zeros((), dtype=kld.dtype, device=kld.device))
    beta = float(kl_ctrl.value)
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, m, dim=-1).mean().item())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics
