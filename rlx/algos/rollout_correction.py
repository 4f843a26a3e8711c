"""Rollout correction (verl's `algorithm.rollout_correction`, decoupled mode): the rollout engine samples from
pi_rollout (e.g. vLLM in bf16), the trainer's old log-probs are pi_old (FSDP): with log r = log pi_old - log pi_rollout
per token,

- importance weights (Ionides 2008 truncated IS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training"; Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch"): token level w_t = exp(log r_t), sequence level w = exp(sum_t log r_t) on every
  token; truncated at an upper threshold (TIS), or zeroed outside [lower, upper] (IcePop, `"lower_upper"`);
  optionally divided by their batch mean. The policy loss of each token is multiplied by its weight.
- rejection sampling: tokens (or whole sequences) whose divergence statistic is out of bounds leave the response
  mask. k1 = -log r (bounds on the ratio, `"lower_upper"`, or an upper one whose reciprocal is the lower), k2 =
  (log r)^2 / 2, k3 = exp(log r) - 1 - log r (upper bounds); per token, or the sequence's sum / mean / max.
- diagnostics of the gap (KL, perplexities, chi^2).

Log-ratios are clamped to [-20, 20] before exponentiating. Metric names are verl's (`rollout_corr/...`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def _msum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    x = torch.where(mask.bool(), x, 0.0)
    return (x * mask).sum() if dim is None else (x * mask).sum(dim=dim)


def _mmean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return _msum(x, mask, dim) / (count + 1e-8)


def parse_is_threshold(spec) -> tuple[float, Optional[float]]:
    """(upper, lower) of `rollout_is_threshold`: a number (TIS: lower None) or a `"lower_upper"` string (IcePop)."""
    key = "algorithm.rollout_correction.rollout_is_threshold"
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{key}={spec!r} must be a number or a 'lower_upper' string")
    lower = None
    try:
        if isinstance(spec, str) and "_" in spec.strip():
            low, high = spec.strip().split("_", 1)
            lower, upper = float(low), float(high)
        else:
            upper = float(spec)
    except ValueError:
        raise ValueError(f"{key}={spec!r} is not a number nor a 'lower_upper' pair of numbers") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{key}={spec!r}: the bounds must be positive, lower <= upper")
    return upper, lower


def parse_rs(options: str, spec) -> dict[str, tuple[Optional[float], float]]:
    """{option: (lower ratio bound or None, upper bound)} of `rollout_rs` (comma-separated, duplicates dropped) and
    `rollout_rs_threshold` (one value for all options, or one per option, comma-separated)."""
    key = "algorithm.rollout_correction"
    names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    bad = [o for o in names if o not in RS_OPTIONS]
    if not names or bad:
        raise ValueError(f"{key}.rollout_rs={options!r}: options must be among {list(RS_OPTIONS)}")
    if spec is None or isinstance(spec, bool):
        raise ValueError(f"{key}.rollout_rs_threshold={spec!r}: give a threshold with rollout_rs={options!r}")
    specs = [str(spec)] if isinstance(spec, (int, float)) else [s.strip() for s in str(spec).split(",") if s.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"{key}.rollout_rs_threshold={spec!r}: one threshold, or one per rollout_rs option "
                         f"({len(names)})")
    specs = specs * len(names) if len(specs) == 1 else specs
    out = {}
    for name, s in zip(names, specs):
        try:
            if name.endswith("k1"):
                low, high = s.split("_", 1) if "_" in s else (str(1.0 / float(s)), s)
                lower, upper = float(low), float(high)
                if not 0 < lower <= upper:
                    raise ValueError
            else:
                if "_" in s:
                    raise ValueError
                lower, upper = None, float(s)
                if upper <= 0:
                    raise ValueError
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{key}.rollout_rs_threshold={spec!r}: {s!r} is not valid for {name} (k1: positive "
                             f"'lower_upper' or an upper ratio bound; k2/k3: one positive upper bound)") from None
        out[name] = (lower, upper)
    return out


def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold,
               batch_normalize: bool = False) -> tuple[torch.Tensor, dict]:
    """Importance weights pi_old / pi_rollout (0 on padding), truncated or IcePop-masked, and their metrics."""
    if level not in IS_LEVELS:
        raise ValueError(f"algorithm.rollout_correction.rollout_is={level!r}; use one of {list(IS_LEVELS)} or null")
    upper, lower = parse_is_threshold(threshold)
    if level == "token":
        log_for_metrics = log_ratio
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_for_metrics = _msum(log_ratio, mask, dim=-1).unsqueeze(-1)
        raw = torch.exp(log_for_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = _is_metrics(weights, raw, log_for_metrics, mask, level, upper, lower)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = _mmean(((raw < lower) | (raw > upper)).float(), mask).item()
    weights = weights.detach()
    if batch_normalize:
        if level == "token":
            mean = _mmean(weights, mask)
        else:
            seq_mask = (mask.sum(-1) > 0).to(weights.dtype)
            mean = (_mmean(weights, mask, dim=-1) * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean.item()
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _is_metrics(weights, raw, log_for_metrics, mask, level, upper, lower) -> dict:
    m = {}
    lower = 1.0 / upper if lower is None else lower
    valid = mask.bool()
    m["rollout_is_mean"] = _mmean(weights, mask).item()
    if level == "sequence":
        m["rollout_is_max"] = math.exp(min(log_for_metrics.max().item(), SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(log_for_metrics.min().item())
        m["rollout_is_ratio_fraction_high"] = (log_for_metrics > math.log(upper)).float().mean().item()
        m["rollout_is_ratio_fraction_low"] = (log_for_metrics < math.log(lower)).float().mean().item()
    else:
        m["rollout_is_ratio_fraction_high"] = _mmean((raw > upper).float(), mask).item()
        m["rollout_is_ratio_fraction_low"] = _mmean((raw < lower).float(), mask).item()
        m["rollout_is_max"] = weights.masked_fill(~valid, float("-inf")).max().item()
        m["rollout_is_min"] = weights.masked_fill(~valid, float("inf")).min().item()
    bounded = weights.clamp(min=0.0, max=upper)
    if mask.sum() > 1:
        var = _mmean(bounded.square(), mask) - _mmean(bounded, mask).square()
        m["rollout_is_std"] = var.clamp(min=0.0).sqrt().item()
    else:
        m["rollout_is_std"] = 0.0
    normalised = bounded / (_mmean(bounded, mask) + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / _mmean(normalised.square(), mask).item()
    seq = _mmean(weights, mask, dim=-1)
    m["rollout_is_seq_mean"] = seq.mean().item()
    m["rollout_is_seq_std"] = seq.std().item() if seq.numel() > 1 else 0.0
    m["rollout_is_seq_max"] = seq.max().item()
    m["rollout_is_seq_min"] = seq.min().item()
    m["rollout_is_seq_max_deviation"] = (seq - 1.0).abs().max().item()
    raw_seq = _mmean(raw, mask, dim=-1)
    m["rollout_is_seq_fraction_high"] = (raw_seq > upper).float().mean().item()
    m["rollout_is_seq_fraction_low"] = (raw_seq < lower).float().mean().item()
    return m


def _seq_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    top = x.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(top == float("-inf"), torch.zeros_like(top), top)


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, options: str, thresholds) -> tuple[torch.Tensor, dict]:
    """The response mask without the rejected tokens (every option must accept a token), and the metrics."""
    bounds = parse_rs(options, thresholds)
    if log_ratio.shape[0] == 0:
        return mask, {}
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -safe, "k2": 0.5 * safe ** 2, "k3": torch.exp(safe) - 1.0 - safe}
    valid = mask.bool()
    seq_valid = mask.sum(dim=-1) > 0
    keep_all = torch.ones_like(mask, dtype=log_ratio.dtype)
    metrics: dict = {}
    for name, (lower, upper) in bounds.items():
        kind = name[-2:]
        k1 = kind == "k1"
        low_b = math.log(lower) if lower is not None else float("-inf")  # parse_rs: a lower bound for k1 only
        high_b = math.log(upper) if k1 else upper
        values = per_token[kind]
        if name.startswith("token"):
            stat, seq_stat = values, None
        else:
            reduce = {"seq_sum": lambda v: _msum(v, mask, dim=-1), "seq_mean": lambda v: _mmean(v, mask, dim=-1),
                      "seq_max": lambda v: _seq_max(v, mask)}[name.rsplit("_", 1)[0]]
            seq_stat = reduce(values)
            stat = seq_stat.unsqueeze(-1).expand_as(mask)
        keep = (stat <= high_b) & (stat >= low_b) if k1 else stat <= high_b
        metrics.update(_rs_metrics(name, stat, mask, seq_valid, seq_stat, high_b, low_b if k1 else 0.0, k1))
        keep_f = keep.to(log_ratio.dtype)
        keep_all = keep_all * keep_f
        seq_kept = (~((~keep) & valid)).all(dim=-1)
        metrics[f"rollout_rs_{name}_masked_fraction"] = _mmean(1 - keep_f, mask).item()
        sv = seq_valid.float()
        metrics[f"rollout_rs_{name}_seq_masked_fraction"] = (
            (((1.0 - seq_kept.to(log_ratio.dtype)) * sv).sum() / sv.sum()).item() if sv.sum() > 0 else 0.0)
    metrics["rollout_rs_masked_fraction"] = _mmean(1 - keep_all, mask).item()
    rejected = ~((keep_all > 0.5) & valid) & valid
    metrics["rollout_rs_seq_masked_fraction"] = rejected.any(dim=-1).float().mean().item()
    return (mask * keep_all).to(mask.dtype), metrics


def _rs_metrics(name, stat, mask, seq_valid, seq_stat, upper, lower, use_lower) -> dict:
    if not mask.any():
        raise ValueError("rejection sampling needs at least one valid response token")
    p, m = f"rollout_rs_{name}", {}
    valid = mask.bool()
    seq = seq_stat if seq_stat is not None else _mmean(stat, mask, dim=-1)
    seq = seq[seq_valid]
    by_seq = seq_stat is not None and seq.numel() > 0
    m[f"{p}_mean"] = _mmean(stat, mask).item()
    if by_seq:
        m[f"{p}_max"], m[f"{p}_min"] = seq.max().item(), seq.min().item()
        m[f"{p}_fraction_high"] = (seq > upper).float().mean().item()
        m[f"{p}_fraction_low"] = (seq < lower).float().mean().item() if use_lower else 0.0
    else:
        m[f"{p}_max"] = stat.masked_fill(~valid, float("-inf")).max().item()
        m[f"{p}_min"] = stat.masked_fill(~valid, float("inf")).min().item()
        m[f"{p}_fraction_high"] = _mmean((stat > upper).float(), mask).item()
        m[f"{p}_fraction_low"] = _mmean((stat < lower).float(), mask).item() if use_lower else 0.0
    if mask.sum() > 1:
        bounded = stat.clamp(min=lower if use_lower else 0.0, max=upper)
        var = _mmean(bounded.square(), mask) - _mmean(bounded, mask).square()
        m[f"{p}_std"] = var.clamp(min=0.0).sqrt().item()
    else:
        m[f"{p}_std"] = 0.0
    if seq.numel() > 0:
        m[f"{p}_seq_mean"] = seq.mean().item()
        m[f"{p}_seq_std"] = seq.std().item() if seq.numel() > 1 else 0.0
        m[f"{p}_seq_max"], m[f"{p}_seq_min"] = seq.max().item(), seq.min().item()
        m[f"{p}_seq_max_deviation"] = seq.abs().max().item()
        m[f"{p}_seq_fraction_high"] = (seq > upper).float().mean().item()
        if use_lower:
            m[f"{p}_seq_fraction_low"] = (seq < lower).float().mean().item()
    else:
        for k in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high",
                  "seq_fraction_low"):
            m[f"{p}_{k}"] = 0.0
    return m


def offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> dict:
    """The gap between the two policies: KL(pi_rollout || pi_old) (k1 and k3), per-sequence perplexities and their
    difference, chi^2 at token and sequence level."""
    m = {}
    lp_old = _mmean(old_log_prob, mask, dim=-1)
    m["training_ppl"] = torch.exp(-lp_old).mean().item()
    m["training_log_ppl"] = (-lp_old).mean().item()
    log_ratio = old_log_prob - rollout_log_prob
    m["kl"] = _mmean(rollout_log_prob - old_log_prob, mask).item()
    m["k3_kl"] = _mmean(torch.exp(log_ratio) - log_ratio - 1, mask).item()
    lp_rollout = _mmean(rollout_log_prob, mask, dim=-1)
    m["rollout_ppl"] = torch.exp(-lp_rollout).mean().item()
    m["rollout_log_ppl"] = (-lp_rollout).mean().item()
    diff = lp_rollout - lp_old
    m["log_ppl_diff"] = diff.mean().item()
    m["log_ppl_abs_diff"] = diff.abs().mean().item()
    m["log_ppl_diff_max"], m["log_ppl_diff_min"] = diff.max().item(), diff.min().item()
    m["ppl_ratio"] = torch.exp(diff).mean().item()
    m["chi2_token"] = (_mmean(torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(), mask) - 1.0).item()
    seq_sum = _msum(log_ratio, mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    m["chi2_seq"] = (torch.exp(2.0 * seq_sum).mean() - 1.0).item()
    return m


def rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor,
                       rollout_is: Optional[str], rollout_is_threshold, rollout_is_batch_normalize: bool,
                       rollout_rs: Optional[str], rollout_rs_threshold
                       ) -> tuple[Optional[torch.Tensor], torch.Tensor, dict]:
    """(IS weights or None, the response mask after rejection, metrics named `rollout_corr/<name>`)."""
    if not mask.any():
        raise ValueError("rollout correction needs at least one valid response token")
    assert old_log_prob.shape == rollout_log_prob.shape == mask.shape, (old_log_prob.shape, rollout_log_prob.shape,
                                                                        mask.shape)
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_m = is_weights(log_ratio, mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
        metrics.update(is_m)
    new_mask = mask.clone()
    if rollout_rs is not None:
        new_mask, rs_m = rejection_mask(log_ratio, mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_m)
    metrics.update(offpolicy_metrics(old_log_prob, rollout_log_prob, mask))
    return weights, new_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def bypass_policy_loss(ppo_clip, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                       response_mask: torch.Tensor, loss_agg_mode: str, config, global_batch, loss_type: str,
                       correction: dict) -> tuple[torch.Tensor, dict]:
    """verl's bypass mode (`rollout_correction.bypass_mode`): `old_log_prob` are the rollout engine's own log-probs
    (no old log-prob pass), and the correction is computed here, per micro-batch, against the current policy:
    importance weights ``w = pi / pi_rollout`` (`correction`'s rollout_is options, no gradient) and the rejection
    mask (rollout_rs). `loss_type`:
    - ppo_clip: `ppo_clip` (the vanilla PPO loss) on the rejection mask; its ratio pi / pi_rollout already is the
      importance correction, so the weights only feed the metrics;
    - reinforce: ``-A * log pi * w`` on the rejection mask (the weights as given, 1 without rollout_is).
    Returns `(loss, metrics)`: the loss's own metrics plus `rollout_corr/*`."""
    with torch.no_grad():
        weights, mask, corr_metrics = rollout_correction(log_prob.detach(), old_log_prob, response_mask.bool(),
                                                         **correction)
    mask = mask.to(response_mask.dtype)
    if loss_type == "reinforce":
        from rlx.algos.core_algos import GlobalBatchInfo, masked_mean

        losses = -advantages * log_prob * (weights if weights is not None else 1.0)
        loss = (global_batch or GlobalBatchInfo()).agg(losses, mask, loss_agg_mode)
        metrics = {"actor/ppo_kl": masked_mean((old_log_prob - log_prob).detach(), mask)}
    elif loss_type == "ppo_clip":
        loss, metrics = ppo_clip(old_log_prob, log_prob, advantages, mask, loss_agg_mode=loss_agg_mode,
                                 config=config, rollout_is_weights=None, global_batch=global_batch)
    else:
        raise ValueError(f"algorithm.rollout_correction.loss_type={loss_type!r}: choose one of "
                         f"{list(BYPASS_LOSS_TYPES)}")
    return loss, {**metrics, **corr_metrics}
