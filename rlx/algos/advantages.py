"""Advantage estimators by verl's names (`algorithm.adv_estimator`), one function per estimator.

Each returns ``(advantages, returns)``, both ``[B, T]`` over response tokens and 0 at masked positions (``returns``
is what the critic would regress on; outcome estimators return the advantages again). Groups are the rows sharing
an ``index`` label (the prompt's uid): the ``rollout.n`` responses to one prompt. `compute_advantage` dispatches by
name and passes each estimator what it reads. gae, grpo and rloo live in `core_algos`.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from rlx.algos.core_algos import (_as_bool_mask, _group_ids, _group_stats, compute_gae_advantage_return,
                                  compute_grpo_outcome_advantage, compute_rloo_outcome_advantage, masked_whiten)

__all__ = ["ADV_ESTIMATORS", "GROUPED", "compute_advantage"]


def _broadcast(scalars: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A per-row scalar on every valid token of the row, 0 elsewhere."""
    m = _as_bool_mask(response_mask)
    return torch.where(m, scalars.unsqueeze(-1), torch.zeros((), dtype=scalars.dtype, device=scalars.device))


def _group_mean(scores: torch.Tensor, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (group size, group mean), the mean of a one-row group being 0 (verl's convention)."""
    count, total, _ = _group_stats(scores, index)
    return count, torch.where(count > 1, total / count, torch.zeros_like(total))


def _reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``G_t = sum_{s >= t} r_s`` over valid tokens (undiscounted)."""
    r = torch.where(_as_bool_mask(response_mask), token_level_rewards, torch.zeros_like(token_level_rewards))
    return r.flip(-1).cumsum(-1).flip(-1)


@torch.no_grad()
def compute_grpo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                                              norm_adv_by_std_in_grpo: bool = True):
    """grpo_vectorized: verl's tensorised GRPO (same values as ``grpo``; see
    `core_algos.compute_grpo_outcome_advantage`). rlx's ``grpo`` is already vectorised."""
    return compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon,
                                          norm_adv_by_std_in_grpo)


@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon: float = 1e-6):
    """rloo_vectorized: RLOO (Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740), ``A_i = s_i - mean of the
    others``, except that a response alone in its group gets 0 (``rloo`` keeps its raw score), as verl's."""
    del epsilon
    scores = token_level_rewards.sum(dim=-1)
    count, total, _ = _group_stats(scores, index)
    adv = torch.where(count > 1, (count * scores - total) / (count - 1).clamp(min=1), torch.zeros_like(scores))
    adv = _broadcast(adv, response_mask)
    return adv, adv


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma: float = 1.0):
    """REINFORCE++ (Hu 2025, https://arxiv.org/abs/2501.03262): discounted returns ``G_t = r_t + gamma * G_next``
    (masked positions pass the running return through and add nothing), whitened over the batch's valid tokens.
    Returns ``(whitened advantages, the returns)``."""
    m = _as_bool_mask(response_mask)
    running = torch.zeros_like(token_level_rewards[:, 0])
    returns = torch.zeros_like(token_level_rewards)
    for t in reversed(range(token_level_rewards.shape[1])):
        candidate = token_level_rewards[:, t] + gamma * running
        running = torch.where(m[:, t], candidate, running)
        returns[:, t] = torch.where(m[:, t], candidate, torch.zeros_like(candidate))
    adv = torch.where(m, masked_whiten(returns, m), torch.zeros_like(returns))
    return adv, returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index,
                                                           epsilon: float = 1e-6):
    """REINFORCE++-baseline (https://arxiv.org/abs/2501.03262): the score minus its group's mean (a one-row group:
    mean 0) on every valid token, then whitened over the batch's valid tokens."""
    del epsilon
    scores = token_level_rewards.sum(dim=-1)
    _, mean = _group_mean(scores, index)
    m = _as_bool_mask(response_mask)
    adv = _broadcast(scores - mean, m)
    adv = torch.where(m, masked_whiten(adv, m), torch.zeros_like(adv))
    return adv, adv


@torch.no_grad()
def compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask):
    """ReMax (Li et al. 2023, https://arxiv.org/abs/2310.10505): the reward-to-go minus the reward of the greedy
    response to the same prompt (``reward_baselines``, ``[B]``), which is subtracted on valid tokens only (as verl,
    a masked position between turns keeps its reward-to-go). Returns ``(advantages, reward-to-go)``."""
    m = _as_bool_mask(response_mask)
    returns = _reward_to_go(token_level_rewards, m)
    adv = returns - reward_baselines.unsqueeze(-1) * m.to(returns.dtype)
    return adv, returns


@torch.no_grad()
def compute_opo_outcome_advantage(token_level_rewards, response_mask, index, epsilon: float = 1e-6):
    """OPO, On-Policy RL with Optimal reward baseline (Hao et al. 2025, https://arxiv.org/abs/2505.23585): the
    score minus the length-weighted mean score of its group ``sum_j |y_j| s_j / sum_j |y_j|`` (a one-row group:
    baseline 0)."""
    del epsilon
    scores = token_level_rewards.sum(dim=-1)
    lengths = _as_bool_mask(response_mask).sum(dim=-1).to(scores.dtype)
    ids, n = _group_ids(index, scores.shape[0])
    ids = ids.to(scores.device)
    weighted = torch.zeros(n, dtype=scores.dtype, device=scores.device).index_add_(0, ids, lengths * scores)
    total_len = torch.zeros(n, dtype=scores.dtype, device=scores.device).index_add_(0, ids, lengths)
    count = torch.zeros(n, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    baseline = torch.where(count > 1, weighted / total_len, torch.zeros_like(weighted))[ids]
    adv = _broadcast(scores - baseline, response_mask)
    return adv, adv


@torch.no_grad()
def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                                  f_norm: float = 1.0):
    """GPG, Group Policy Gradient (Chu et al. 2025, https://arxiv.org/abs/2504.02546): ``alpha * (s - group mean)
    / f_norm`` with ``alpha = B / (responses with a non-zero score)`` (at least 1 in the denominator), which
    rescales the batch's gradient for the groups that carry none. A one-row group has mean 0."""
    del epsilon
    scores = token_level_rewards.sum(dim=-1)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    _, mean = _group_mean(scores, index)
    adv = _broadcast(alpha * (scores - mean) / f_norm, response_mask)
    return adv, adv


@torch.no_grad()
def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                                         norm_adv_by_std_in_grpo: bool = True):
    """Pass@k training (Chen et al. 2025, https://arxiv.org/abs/2503.19595): in each group only the best response
    gets an advantage, ``best - second best`` (divided by ``std + epsilon`` of the group's scores with
    ``norm_adv_by_std_in_grpo``); every other response gets 0. Every group needs at least 2 responses. Ties go to
    the response ``torch.topk`` ranks first."""
    scores = token_level_rewards.sum(dim=-1)
    ids, n = _group_ids(index, scores.shape[0])
    adv = torch.zeros_like(scores)
    for g in range(n):
        rows = torch.nonzero(ids == g, as_tuple=True)[0].to(scores.device)
        if len(rows) < 2:
            raise ValueError(f"algorithm.adv_estimator=grpo_passk needs at least 2 responses per prompt, got "
                             f"{len(rows)}; set actor_rollout_ref.rollout.n >= 2")
        group = scores[rows]
        top, top_idx = torch.topk(group, 2)
        value = top[0] - top[1]
        if norm_adv_by_std_in_grpo:
            value = value / (torch.std(group) + epsilon)
        adv[rows[top_idx[0]]] = value
    adv = _broadcast(adv, response_mask)
    return adv, adv


@torch.no_grad()
def compute_gdpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True,
                                   reward_components: Optional[Sequence[torch.Tensor]] = None,
                                   reward_weights: Optional[Sequence[float]] = None):
    """GDPO, Group reward-Decoupled normalization Policy Optimization (https://arxiv.org/abs/2601.05242).

    Each reward component (``reward_components``: one ``[B]`` score per component, from the reward function's dict
    under ``algorithm.gdpo_reward_keys``; default: the one total reward) gets its own GRPO advantage within the
    groups, so that a large component does not drown a small one; the advantages are summed with
    ``reward_weights`` (default 1 each) and the sum is whitened over the batch's valid tokens.
    """
    m = _as_bool_mask(response_mask)
    components = [token_level_rewards.sum(dim=-1)] if reward_components is None else list(reward_components)
    weights = [1.0] * len(components) if reward_weights is None else list(reward_weights)
    if len(weights) != len(components):
        raise ValueError(f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(components)} "
                         f"algorithm.gdpo_reward_keys; give one weight per key")
    total = None
    for score, w in zip(components, weights):
        score = torch.as_tensor(score, dtype=torch.float32, device=token_level_rewards.device).reshape(-1, 1)
        adv, _ = compute_grpo_outcome_advantage(score, torch.ones_like(score), index, epsilon,
                                                norm_adv_by_std_in_grpo)
        term = float(w) * _broadcast(adv[:, 0], m)
        total = term if total is None else total + term
    assert total is not None, "no reward component (the config check refuses empty algorithm.gdpo_reward_keys)"
    adv = torch.where(m, masked_whiten(total, m), torch.zeros_like(total))
    return adv, adv


@torch.no_grad()
def _otb_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights):
    """What both optimal-token-baseline estimators start from: the mask (bool, float), the reward-to-go, and the
    cumulative weights ``W_t = sum_{s <= t} (1 - 2 pi_s + sum_v pi_v^2)`` (times ``rollout_is_weights^2``)."""
    m = _as_bool_mask(response_mask)
    mf = m.to(token_level_rewards.dtype)
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.square()
    return m, mf, _reward_to_go(token_level_rewards, m), (w * mf).cumsum(dim=-1)


def compute_optimal_token_baseline_advantage(token_level_rewards, response_mask, index, old_log_probs,
                                             sum_pi_squared, rollout_is_weights=None, handle_zero_tail: bool = True,
                                             epsilon: float = 1e-8):
    """Optimal token baseline (verl's OTB): a baseline per token position and group that minimises the gradient's
    variance, ``B_t = sum_i G_i,t W_i,t / (sum_i W_i,t + epsilon)`` over the group's responses valid at ``t``, with
    ``W_t = sum_{s <= t} (1 - 2 pi_s + sum_v pi_v^2)`` (the cumulative squared norm of the score function's
    logit-gradient; ``sum_pi_squared`` from ``actor.calculate_sum_pi_squared``), times ``rollout_is_weights^2``
    when given. ``A_t = G_t - B_t`` with ``G`` the reward-to-go. A one-row group gets no baseline. With
    ``handle_zero_tail``, the tokens of a group's single longest response past the second longest's length get
    baseline 0 (no other response to compare with). Returns ``(advantages, reward-to-go)``."""
    m, mf, returns, w_cum = _otb_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
                                        rollout_is_weights)
    baselines = torch.zeros_like(returns)
    ids, n = _group_ids(index, returns.shape[0])
    for g in range(n):
        rows = torch.nonzero(ids == g, as_tuple=True)[0].to(returns.device)
        if len(rows) < 2:
            continue
        wg, mg = w_cum[rows] * mf[rows], mf[rows]
        baselines[rows] = ((returns[rows] * wg).sum(dim=0) / (wg.sum(dim=0) + epsilon)).expand(len(rows), -1)
        if handle_zero_tail:
            _zero_tail(baselines, rows, mg.sum(dim=-1))
    adv = torch.where(m, returns - baselines, torch.zeros_like(returns))
    return adv, returns


def _zero_tail(baselines: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor) -> None:
    """Baseline 0 past the second-longest length on the group's one longest row (if it is strictly longest);
    ``baselines`` rows are indexed as the group's ``rows`` (lengths in the same order)."""
    ordered = torch.sort(lengths).values
    longest, second = int(ordered[-1]), int(ordered[-2])
    at_max = torch.nonzero(lengths == longest, as_tuple=True)[0]
    if len(at_max) == 1 and longest > second:
        baselines[rows[at_max[0]], second:] = 0.0


@torch.no_grad()
def compute_tir_optimal_token_baseline_advantage(token_level_rewards, response_mask, index, old_log_probs,
                                                 sum_pi_squared, rollout_is_weights=None,
                                                 handle_zero_tail: bool = True, epsilon: float = 1e-8):
    """The optimal token baseline for multi-turn (tool-integrated) responses: as
    ``optimal_token_baseline``, with positions counted over each response's valid (model-generated) tokens only,
    so that the k-th generated token of every response in the group shares a baseline whatever observation tokens
    sit between them. Rows without a valid token are left out."""
    m, mf, returns, w_cum = _otb_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
                                        rollout_is_weights)
    lengths = m.sum(dim=-1)
    width = int(lengths.max()) if lengths.numel() else 0
    # compact: each row's valid tokens first, in order
    W = w_cum.new_zeros(len(lengths), width)
    G = torch.zeros_like(W)
    for i in range(len(lengths)):
        if lengths[i] > 0:
            W[i, :lengths[i]] = w_cum[i, m[i]]
            G[i, :lengths[i]] = returns[i, m[i]]
    baselines = torch.zeros_like(G)
    ids, n = _group_ids(index, len(lengths))
    ids = ids.to(lengths.device)
    for g in range(n):
        rows = torch.nonzero((ids == g) & (lengths > 0), as_tuple=True)[0]
        if len(rows) < 2:
            continue
        baselines[rows] = ((G[rows] * W[rows]).sum(dim=0) / (W[rows].sum(dim=0) + epsilon)).to(baselines.dtype)
        if handle_zero_tail:
            _zero_tail(baselines, rows, lengths[rows])
    adv = torch.zeros_like(returns)
    for i in range(len(lengths)):
        if lengths[i] > 0:
            adv[i, m[i]] = (G[i] - baselines[i])[:lengths[i]]
    return adv, returns


GROUPED = ("grpo", "rloo", "grpo_vectorized", "rloo_vectorized", "reinforce_plus_plus_baseline", "opo", "gpg",
           "grpo_passk", "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline")
"""Estimators that compare the responses to one prompt (they want rollout.n >= 2)."""
ADV_ESTIMATORS = ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo",
                  "gpg", "grpo_passk", "grpo_vectorized", "rloo_vectorized", "optimal_token_baseline",
                  "tir_optimal_token_baseline", "gdpo")
"""Every `algorithm.adv_estimator` rlx accepts (verl 0.9.1's)."""


def compute_advantage(adv_estimator: str, *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                      values: Optional[torch.Tensor] = None, index: Any = None, gamma: float = 1.0,
                      lam: float = 1.0, norm_adv_by_std_in_grpo: bool = True,
                      reward_baselines: Optional[torch.Tensor] = None, old_log_probs: Optional[torch.Tensor] = None,
                      sum_pi_squared: Optional[torch.Tensor] = None, rollout_is_weights: Optional[torch.Tensor] = None,
                      reward_components: Optional[Sequence[torch.Tensor]] = None,
                      reward_weights: Optional[Sequence[float]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator named by ``algorithm.adv_estimator`` on what it needs; returns ``(advantages, returns)``."""
    name = adv_estimator
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"Unknown algorithm.adv_estimator={name!r}; valid choices: {list(ADV_ESTIMATORS)}")
    r, m = token_level_rewards, response_mask

    def need(value, what):
        if value is None:
            raise ValueError(f"algorithm.adv_estimator={name} needs {what}")
        return value

    if name in GROUPED:
        need(index, "the group index (prompt uids)")
    if name == "gae":
        return compute_gae_advantage_return(r, need(values, "critic values (is the critic enabled?)"), m, gamma, lam)
    if name == "grpo":
        return compute_grpo_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    if name == "grpo_vectorized":
        return compute_grpo_vectorized_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    if name == "grpo_passk":
        return compute_grpo_passk_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    if name == "gdpo":
        return compute_gdpo_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                                              reward_components=reward_components, reward_weights=reward_weights)
    if name == "rloo":
        return compute_rloo_outcome_advantage(r, m, index)
    if name == "rloo_vectorized":
        return compute_rloo_vectorized_outcome_advantage(r, m, index)
    if name == "reinforce_plus_plus":
        return compute_reinforce_plus_plus_outcome_advantage(r, m, gamma)
    if name == "reinforce_plus_plus_baseline":
        return compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, index)
    if name == "remax":
        return compute_remax_outcome_advantage(r, need(reward_baselines, "the greedy baseline's rewards"), m)
    if name == "opo":
        return compute_opo_outcome_advantage(r, m, index)
    if name == "gpg":
        return compute_gpg_outcome_advantage(r, m, index)
    fn = compute_optimal_token_baseline_advantage if name == "optimal_token_baseline" else \
        compute_tir_optimal_token_baseline_advantage
    return fn(r, m, index, need(old_log_probs, "old log-probs"),
              need(sum_pi_squared, "sum_pi_squared (set actor_rollout_ref.actor.calculate_sum_pi_squared=True)"),
              rollout_is_weights)
