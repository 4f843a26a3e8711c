"""Policy losses by verl's names (`actor_rollout_ref.actor.policy_loss.loss_mode`), one function per mode.

Every function has one signature:

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, global_batch)
        -> (loss, metrics)

* tensors are ``[B, T]`` over response tokens; ``log_prob`` carries the gradient;
* ``config``: a `PolicyLossParams`, or an actor config (rlx's or verl's: same key names) it is read from;
* ``rollout_is_weights``: per-token importance weights of rollout correction, multiplied into the per-token loss
  (None: none);
* ``global_batch``: `core_algos.GlobalBatchInfo`, the counts of the whole mini-batch that make micro-batches add up
  (None: this batch is the whole batch);
* ``metrics``: detached scalars named as verl names them (``actor/pg_clipfrac``, ``actor/ppo_kl``,
  ``actor/pg_clipfrac_lower``); each mode reports the ones verl's reports.

Modes whose token selection depends on batch statistics (clip_cov, kl_cov) select within each micro-batch, as verl
does; the others add up exactly over micro-batches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from rlx.algos.core_algos import GlobalBatchInfo, compute_policy_loss, masked_mean

__all__ = ["PolicyLossParams", "POLICY_LOSSES", "LOSS_MODES", "get_policy_loss_fn", "register_policy_loss"]

POLICY_LOSSES: dict[str, Callable] = {}


def register_policy_loss(name: str):
    """Register a policy loss under verl's name."""
    def deco(fn):
        POLICY_LOSSES[name] = fn
        return fn
    return deco


def get_policy_loss_fn(name: str) -> Callable:
    if name not in POLICY_LOSSES:
        raise ValueError(f"Unknown actor_rollout_ref.actor.policy_loss.loss_mode={name!r}; valid choices: "
                         f"{list(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


@dataclass(frozen=True)
class PolicyLossParams:
    """The settings the policy losses read (verl's keys and defaults; see rlx.config.schema.ActorConfig)."""

    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = 0.2
    clip_ratio_high: Optional[float] = 0.2
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: Optional[float] = None

    @classmethod
    def of(cls, config) -> "PolicyLossParams":
        """From an actor config (`actor_rollout_ref.actor`, with its `policy_loss` section); a
        `PolicyLossParams` or None (the defaults) passes through."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        pl = config.policy_loss
        return cls(clip_ratio=config.clip_ratio, clip_ratio_low=config.clip_ratio_low,
                   clip_ratio_high=config.clip_ratio_high, clip_ratio_c=config.clip_ratio_c,
                   tau_pos=config.tau_pos, tau_neg=config.tau_neg, clip_cov_ratio=pl.clip_cov_ratio,
                   clip_cov_lb=pl.clip_cov_lb, clip_cov_ub=pl.clip_cov_ub, kl_cov_ratio=pl.kl_cov_ratio,
                   ppo_kl_coef=pl.ppo_kl_coef, dro_beta=pl.dro_beta)

    @property
    def low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


def _finish(pg_losses, response_mask, loss_agg_mode, rollout_is_weights, global_batch):
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return (global_batch or GlobalBatchInfo()).agg(pg_losses, response_mask, loss_agg_mode)


def _metrics(clipfrac=None, ppo_kl=None, clipfrac_lower=None) -> dict:
    out = {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": clipfrac_lower}
    return {k: torch.as_tensor(v).detach().float() for k, v in out.items() if v is not None}


def _log_ratio(log_prob, old_log_prob, clamp: bool = True):
    """``log(pi / pi_old)``, clamped to [-20, 20] for the ``exp`` (verl's guard) unless ``clamp=False``."""
    d = log_prob - old_log_prob
    return torch.clamp(d, min=-20.0, max=20.0) if clamp else d


@register_policy_loss("vanilla")
def vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
            rollout_is_weights=None, global_batch=None):
    """PPO's clipped surrogate (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) with asymmetric clip
    ranges (DAPO's clip-higher, https://arxiv.org/abs/2503.14476) and dual clip for negative advantages (Ye et al.
    2019, https://arxiv.org/abs/1912.09729); see `core_algos.compute_policy_loss`."""
    p = PolicyLossParams.of(config)
    loss, clipfrac, ppo_kl, lower = compute_policy_loss(
        old_log_prob, log_prob, advantages, response_mask, cliprange=p.clip_ratio, cliprange_low=p.low,
        cliprange_high=p.high, clip_ratio_c=p.clip_ratio_c, loss_agg_mode=loss_agg_mode, global_batch=global_batch,
        rollout_is_weights=rollout_is_weights)
    return loss, _metrics(clipfrac, ppo_kl, lower)


@register_policy_loss("gspo")
def gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean", config=None,
         rollout_is_weights=None, global_batch=None):
    """GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, https://arxiv.org/abs/2507.18071).

    One importance ratio per sequence, the geometric mean of its token ratios ``s_i = exp(mean_t log r_t)``,
    carried by every token as ``s_i,t = sg(s_i) * pi_t / sg(pi_t)`` (value ``s_i``, gradient of ``log pi_t``
    scaled by ``s_i``; the log is capped at 10). The PPO clip applies to ``s_i,t`` with the clip ranges
    (GSPO's are tiny, e.g. 3e-4 / 4e-4); no dual clip. Metrics: pg_clipfrac, ppo_kl (token-level), and
    pg_clipfrac_lower = 0.
    """
    p = PolicyLossParams.of(config)
    m = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    lengths = m.sum(dim=-1).clamp(min=1)
    seq_log_ratio = torch.where(m, log_ratio, torch.zeros_like(log_ratio)).sum(dim=-1) / lengths
    log_s = (log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp(max=10.0)
    s = torch.exp(log_s)
    unclipped = -advantages * s
    clipped = -advantages * torch.clamp(s, 1 - p.low, 1 + p.high)
    pg_losses = torch.maximum(unclipped, clipped)
    loss = _finish(pg_losses, m, loss_agg_mode, rollout_is_weights, global_batch)
    clipfrac = masked_mean((clipped > unclipped).float(), m)
    return loss, _metrics(clipfrac, masked_mean(-log_ratio, m), 0.0)


@register_policy_loss("sapo")
def sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean", config=None,
         rollout_is_weights=None, global_batch=None):
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, https://arxiv.org/abs/2511.20347).

    A smooth gate replaces the hard clip: per token ``L = -A * f(r)``, ``f(r) = sigmoid(tau * (r - 1)) * 4 / tau``
    with ``tau = actor.tau_pos`` where ``A > 0`` and ``actor.tau_neg`` otherwise (its gradient ``A * r *
    sigmoid'`` is largest at ``r = 1`` and fades away from it). Always aggregated seq-mean-token-mean, as verl
    (``loss_agg_mode`` is not read). Metrics: ppo_kl; pg_clipfrac and pg_clipfrac_lower = 0.
    """
    del loss_agg_mode
    p = PolicyLossParams.of(config)
    m = response_mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.as_tensor(p.tau_pos, dtype=advantages.dtype, device=advantages.device),
                      torch.as_tensor(p.tau_neg, dtype=advantages.dtype, device=advantages.device))
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = _finish(-gates * advantages, m, "seq-mean-token-mean", rollout_is_weights, global_batch)
    return loss, _metrics(0.0, masked_mean(-log_ratio, m), 0.0)


@register_policy_loss("gpg")
def gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
        rollout_is_weights=None, global_batch=None):
    """GPG, Group Policy Gradient (Chu et al. 2025, https://arxiv.org/abs/2504.02546): plain REINFORCE,
    ``L = -A * log pi`` (no ratio, no clip). Reports no metric, as verl."""
    del old_log_prob, config
    return _finish(-log_prob * advantages, response_mask.bool(), loss_agg_mode, rollout_is_weights, global_batch), {}


@register_policy_loss("clip_cov")
def clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None, global_batch=None):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    https://arxiv.org/abs/2505.22617).

    The PPO clip loss (no ratio clamp, no dual clip), except that a few tokens get no gradient at all: those the
    clip did not already clip whose centred covariance ``(A - mean A) * (log pi - mean log pi)`` lies strictly
    between ``policy_loss.clip_cov_lb`` and ``clip_cov_ub``; ``max(1, int(clip_cov_ratio * valid tokens))`` of them,
    drawn at random (``torch.randperm``) among the candidates of this micro-batch. pg_clipfrac is the fraction of
    valid tokens so detached; ppo_kl as PPO.
    """
    p = PolicyLossParams.of(config)
    if not p.clip_cov_ratio > 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.clip_cov_ratio={p.clip_cov_ratio} must be > 0")
    m = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - p.low, 1 + p.high)
    clipped_by_ppo = (clipped > unclipped) & m
    cov = (advantages - masked_mean(advantages, m)) * (log_prob.detach() - masked_mean(log_prob.detach(), m))
    candidates = m & ~clipped_by_ppo & (cov > p.clip_cov_lb) & (cov < p.clip_cov_ub)
    idx = torch.nonzero(candidates)
    n_clip = max(int(p.clip_cov_ratio * int(m.sum())), 1)
    keep = torch.ones_like(advantages)
    if len(idx) > 0:
        idx = idx[torch.randperm(len(idx))[:n_clip]]
        keep[idx[:, 0], idx[:, 1]] = 0
    pg_losses = torch.maximum(unclipped, clipped) * keep
    loss = _finish(pg_losses, m, loss_agg_mode, rollout_is_weights, global_batch)
    return loss, _metrics(masked_mean((keep == 0).float(), m), masked_mean(-log_ratio, m))


@register_policy_loss("kl_cov")
def kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
           rollout_is_weights=None, global_batch=None):
    """KL-Cov (Cui et al. 2025, https://arxiv.org/abs/2505.22617): the unclipped surrogate ``-A * r``, plus
    ``policy_loss.ppo_kl_coef * |log r|`` on the ``max(1, int(kl_cov_ratio * valid tokens))`` valid tokens of this
    micro-batch with the largest centred covariance ``(A - mean A) * (log pi - mean log pi)``. Metric: ppo_kl,
    here the mean ``|log r|``, as verl."""
    p = PolicyLossParams.of(config)
    if not p.kl_cov_ratio > 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.kl_cov_ratio={p.kl_cov_ratio} must be > 0")
    m = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    flat_valid = torch.nonzero(m.reshape(-1), as_tuple=True)[0]
    if len(flat_valid) > 0:
        adv = advantages.detach().reshape(-1)[flat_valid].cpu()
        logp = log_prob.detach().reshape(-1)[flat_valid].cpu()
        cov = (adv - adv.mean()) * (logp - logp.mean())
        top = flat_valid[torch.topk(cov, max(1, int(len(cov) * p.kl_cov_ratio)), largest=True).indices.to(
            flat_valid.device)]
        penalised = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
        penalised[top] = True
        pg_losses = torch.where(penalised.reshape(m.shape), pg_losses + p.ppo_kl_coef * log_ratio.abs(), pg_losses)
    loss = _finish(pg_losses, m, loss_agg_mode, rollout_is_weights, global_batch)
    return loss, _metrics(ppo_kl=masked_mean(log_ratio.abs(), m))


@register_policy_loss("geo_mean")
def geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None, global_batch=None):
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, https://arxiv.org/abs/2507.20673).

    Per sequence: the token log-ratios are clipped to ``[-clip_ratio_low, clip_ratio_high]`` in the pessimistic
    direction of the advantage's sign (``sgn(A) * min(sgn(A) * d, sgn(A) * clip(d))``), averaged over the valid
    tokens, exponentiated: ``L_i = -mean_t(A) * exp(mean_t(clipped d))``. The mean over sequences (fully masked
    rows count as 0) ignores ``loss_agg_mode``, as verl; across micro-batches it is the mini-batch's row mean.
    Rollout-correction weights enter as their per-sequence geometric mean. Metrics: pg_clipfrac (clipped tokens with
    A > 0), pg_clipfrac_lower (with A < 0), ppo_kl.
    """
    del loss_agg_mode
    p = PolicyLossParams.of(config)
    m = response_mask.bool()
    mf = m.to(log_prob.dtype)
    d = log_prob - old_log_prob
    sign = torch.sign(advantages)
    d_clip = torch.clamp(d, -p.low, p.high)
    d_min = sign * torch.minimum(sign * d, sign * d_clip)
    lengths = mf.sum(dim=-1) + 1e-8
    ratio = torch.exp((d_min * mf).sum(dim=-1) / lengths)
    adv = (advantages * mf).sum(dim=-1) / lengths
    seq_losses = -adv * ratio
    if rollout_is_weights is not None:
        seq_losses = seq_losses * torch.exp((torch.log(rollout_is_weights + 1e-10) * mf).sum(dim=-1) / lengths)
    gb = global_batch or GlobalBatchInfo()
    rows = seq_losses.shape[0] if gb.global_batch_size is None else gb.global_batch_size
    loss = seq_losses.sum() / max(rows, 1) * gb.dp_size
    clipped = d != d_clip
    return loss, _metrics(masked_mean((clipped & (advantages > 0)).float(), m), masked_mean(-d, m),
                          masked_mean((clipped & (advantages < 0)).float(), m))


@register_policy_loss("dro")
def dro(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
        rollout_is_weights=None, global_batch=None):
    """DRO, Direct Reward Optimization (Richemond et al. 2024, "Offline Regularised Reinforcement Learning for
    Large Language Models Alignment", https://arxiv.org/abs/2405.19107), as verl's: ``L = -(A * log pi - beta / 2 *
    (log pi - log pi_old)^2)`` with ``beta = policy_loss.dro_beta`` (> 0, required). Metric: ppo_kl."""
    p = PolicyLossParams.of(config)
    if p.dro_beta is None or not p.dro_beta > 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.dro_beta={p.dro_beta} must be a positive number with "
                         f"loss_mode=dro (e.g. policy_loss.dro_beta=0.1)")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * p.dro_beta * log_ratio.square())
    m = response_mask.bool()
    return _finish(pg_losses, m, loss_agg_mode, rollout_is_weights, global_batch), \
        _metrics(ppo_kl=masked_mean(-log_ratio, m))


@register_policy_loss("cispo")
def cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
          rollout_is_weights=None, global_batch=None):
    """CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, 2025, https://arxiv.org/abs/2506.13585).

    The importance weight is clipped and detached, and multiplies a REINFORCE term, so every token keeps a
    gradient: ``L = -sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * log pi``. Metrics: pg_clipfrac (the
    fraction of valid tokens whose weight was clipped), ppo_kl, pg_clipfrac_lower = 0.
    """
    p = PolicyLossParams.of(config)
    m = response_mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1 - p.low, 1 + p.high)
    pg_losses = -weight.detach() * advantages * log_prob
    loss = _finish(pg_losses, m, loss_agg_mode, rollout_is_weights, global_batch)
    return loss, _metrics(masked_mean((ratio != weight).float(), m), masked_mean(-log_ratio, m), 0.0)


def _dppo(valid_pos, valid_neg, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, p,
          rollout_is_weights, global_batch):
    m = response_mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    truncated = torch.clamp(ratio, max=p.clip_ratio_c).detach()
    valid = torch.where(advantages > 0, valid_pos, valid_neg).detach().to(log_prob.dtype)
    pg_losses = -advantages * truncated * log_prob * valid
    loss = _finish(pg_losses, m, loss_agg_mode, rollout_is_weights, global_batch)
    return loss, _metrics(masked_mean(1.0 - valid, m), masked_mean(-log_ratio, m),
                          masked_mean((ratio > p.clip_ratio_c).to(valid.dtype) * valid, m))


@register_policy_loss("dppo_tv")
def dppo_tv(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
            rollout_is_weights=None, global_batch=None):
    """DPPO-Binary-TV, divergence-constrained PPO (https://arxiv.org/abs/2602.04879).

    A token keeps its gradient while the probability moved by at most the clip ranges, read as total-variation
    bounds on the binary (token vs rest) distribution: ``pi - pi_old <= clip_ratio_high`` where ``A > 0``,
    ``>= -clip_ratio_low`` otherwise; the loss is ``-A * sg(min(r, clip_ratio_c)) * log pi`` on those tokens
    (truncated IS instead of dual clip; verl's default clip_ratio_c is 3). Metrics: pg_clipfrac (tokens masked
    out), ppo_kl, pg_clipfrac_lower (kept tokens whose ratio was truncated)."""
    p = PolicyLossParams.of(config)
    dp = torch.exp(log_prob) - torch.exp(old_log_prob)
    return _dppo(dp <= p.high, dp >= -p.low, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, p,
                 rollout_is_weights, global_batch)


@register_policy_loss("dppo_kl")
def dppo_kl(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
            rollout_is_weights=None, global_batch=None):
    """DPPO-Binary-KL (https://arxiv.org/abs/2602.04879): as dppo_tv with the binary KL
    ``pi_old log(pi_old / pi) + (1 - pi_old) log((1 - pi_old + 1e-8) / (1 - pi + 1e-8))`` bounded by the clip
    ranges, only against moves in the advantage's direction (a token whose probability moved the other way
    keeps its gradient)."""
    p = PolicyLossParams.of(config)
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
    return _dppo((binary_kl <= p.high) | (prob <= old_prob), (binary_kl <= p.low) | (prob >= old_prob),
                 old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, p, rollout_is_weights,
                 global_batch)


LOSS_MODES = tuple(POLICY_LOSSES)
"""Every `policy_loss.loss_mode` rlx accepts."""
