"""Unit tests for rlx.algos.core_algos against hand-computed values.

Every expected number below was worked out by hand (the arithmetic is spelled out in comments), not
re-derived with the code under test.
"""
import math

import numpy as np
import pytest
import torch

from rlx.algos import core_algos as ca
from rlx.algos.advantages import compute_advantage

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def close(actual, expected, tol=1e-6):
    actual = torch.as_tensor(actual, dtype=F64)
    expected = torch.as_tensor(expected, dtype=F64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=tol), (actual, expected)


# ------------------------------------------------------------------------------------------------
# constants
# ------------------------------------------------------------------------------------------------
def test_constants():
    assert ca.ADV_ESTIMATORS == ("gae", "grpo", "rloo")
    assert ca.LOSS_AGG_MODES == ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm")
    base = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
    assert ca.KL_PENALTY_TYPES == base + tuple(k + "+" for k in base)
    assert ca.KL_CTRL_TYPES == ("fixed", "adaptive")


# ------------------------------------------------------------------------------------------------
# masked statistics
# ------------------------------------------------------------------------------------------------
X = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
M = [[1, 1, 0], [1, 0, 0]]


def test_masked_mean_all_and_dim():
    # valid: 1, 2, 4 -> 7/3; per row: (1+2)/2 = 1.5, 4/1 = 4
    close(ca.masked_mean(t(X), t(M)), 7 / 3)
    close(ca.masked_mean(t(X), t(M), dim=-1), [1.5, 4.0])
    # bool and int masks behave the same
    close(ca.masked_mean(t(X), t(M).bool()), 7 / 3)
    close(ca.masked_mean(t(X), torch.tensor(M)), 7 / 3)


def test_masked_mean_ignores_nan_at_masked_positions_and_empty_mask():
    x = t(X)
    x[0, 2] = float("nan")
    x[1, 1] = float("inf")
    close(ca.masked_mean(x, t(M)), 7 / 3)
    close(ca.masked_mean(t(X), torch.zeros(2, 3)), 0.0)


def test_masked_var():
    # valid 1, 2, 4: mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 42/9
    # biased 42/27 = 14/9, unbiased 42/18 = 7/3
    close(ca.masked_var(t(X), t(M), unbiased=False), 14 / 9)
    close(ca.masked_var(t(X), t(M)), 7 / 3)
    with pytest.raises(ValueError):
        ca.masked_var(t(X), t([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError):
        ca.masked_var(t(X), torch.zeros(2, 3))


def test_masked_whiten():
    # 1, 2, 3: mean 2, unbiased var 1 -> -1, 0, 1
    x = t([[1.0, 2.0, 3.0]])
    close(ca.masked_whiten(x, torch.ones(1, 3)), [[-1.0, 0.0, 1.0]])
    close(ca.masked_whiten(x, torch.ones(1, 3), shift_mean=False), [[1.0, 2.0, 3.0]])
    # statistics only from valid tokens: valid 2, 4 -> mean 3, var 2 -> (-1/sqrt2, 1/sqrt2)
    y = t([[2.0, 100.0, 4.0]])
    out = ca.masked_whiten(y, t([[1, 0, 1]]))
    close(out[:, [0, 2]], [[-1 / math.sqrt(2), 1 / math.sqrt(2)]])


# ------------------------------------------------------------------------------------------------
# GAE
# ------------------------------------------------------------------------------------------------
def test_gae_full_mask():
    # gamma = lam = 0.5, r = [0, 0, 1], V = [0.2, 0.4, 0.6]
    # t=2: delta = 1 - 0.6 = 0.4, A = 0.4
    # t=1: delta = 0 + 0.5*0.6 - 0.4 = -0.1, A = -0.1 + 0.25*0.4 = 0
    # t=0: delta = 0 + 0.5*0.4 - 0.2 = 0, A = 0 + 0.25*0 = 0
    # returns = A + V = [0.2, 0.4, 1.0]; whitened A: mean 2/15, unbiased std -> [-1, -1, 2]/sqrt(3)
    r = t([[0.0, 0.0, 1.0]])
    v = t([[0.2, 0.4, 0.6]])
    adv, ret = ca.compute_gae_advantage_return(r, v, torch.ones(1, 3), gamma=0.5, lam=0.5)
    close(ret, [[0.2, 0.4, 1.0]])
    s3 = math.sqrt(3)
    close(adv, [[-1 / s3, -1 / s3, 2 / s3]], tol=1e-5)


def test_gae_padding_after_eos_does_not_leak():
    # same sequence as above followed by a padded token holding huge reward/value
    r = t([[0.0, 0.0, 1.0, 100.0]])
    v = t([[0.2, 0.4, 0.6, 50.0]])
    m = t([[1, 1, 1, 0]])
    adv, ret = ca.compute_gae_advantage_return(r, v, m, gamma=0.5, lam=0.5)
    close(ret[:, :3], [[0.2, 0.4, 1.0]])
    s3 = math.sqrt(3)
    close(adv[:, :3], [[-1 / s3, -1 / s3, 2 / s3]], tol=1e-5)


def test_gae_masked_middle_token_is_skipped():
    # mask [1, 0, 1] (e.g. an observation token); r = [0, 7, 1], V = [0.2, 9, 0.6], gamma = lam = 0.5
    # t=2: delta = 1 - 0.6 = 0.4, A = 0.4, next value 0.6
    # t=1: masked -> A and next value pass through (0.4, 0.6)
    # t=0: delta = 0 + 0.5*0.6 - 0.2 = 0.1, A = 0.1 + 0.25*0.4 = 0.2
    # returns at valid positions: 0.2+0.2 = 0.4, 0.4+0.6 = 1.0
    # whitened valid A (0.2, 0.4): mean 0.3, unbiased var 0.02 -> (-1/sqrt2, 1/sqrt2)
    r = t([[0.0, 7.0, 1.0]])
    v = t([[0.2, 9.0, 0.6]])
    m = t([[1, 0, 1]])
    adv, ret = ca.compute_gae_advantage_return(r, v, m, gamma=0.5, lam=0.5)
    close(ret[:, [0, 2]], [[0.4, 1.0]])
    close(adv[:, [0, 2]], [[-1 / math.sqrt(2), 1 / math.sqrt(2)]], tol=1e-5)


def test_gae_nan_in_padding_does_not_leak():
    r = t([[0.0, 0.0, 1.0, float("nan")]])
    v = t([[0.2, 0.4, 0.6, float("nan")]])
    adv, ret = ca.compute_gae_advantage_return(r, v, t([[1, 1, 1, 0]]), gamma=0.5, lam=0.5)
    assert torch.isfinite(adv[:, :3]).all() and torch.isfinite(ret[:, :3]).all()
    close(ret[:, :3], [[0.2, 0.4, 1.0]])


# ------------------------------------------------------------------------------------------------
# GRPO / RLOO
# ------------------------------------------------------------------------------------------------
# group a: scores 1, 0, 2; group b: 3, 5; group c (singleton): 0.5
GRPO_R = [[0.0, 1.0], [0.0, 0.0], [1.5, 0.5], [3.0, 0.0], [2.0, 3.0], [0.5, 0.0]]
GRPO_M = [[1, 1], [1, 1], [1, 1], [1, 0], [1, 1], [1, 1]]
GRPO_IDX = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)


def test_grpo_normalised():
    # a: mean 1, unbiased std sqrt((0 + 1 + 1)/2) = 1 -> 0, -1, 1
    # b: mean 4, unbiased std sqrt((1 + 1)/1) = sqrt2 -> -1/sqrt2, 1/sqrt2
    # c: singleton -> mean 0, std 1 -> 0.5
    eps = 1e-6
    adv, ret = ca.compute_grpo_outcome_advantage(t(GRPO_R), t(GRPO_M), GRPO_IDX, epsilon=eps)
    s2 = math.sqrt(2)
    per_seq = [0.0, -1 / (1 + eps), 1 / (1 + eps), -1 / (s2 + eps), 1 / (s2 + eps), 0.5 / (1 + eps)]
    expected = [[a * m for m in row] for a, row in zip(per_seq, GRPO_M)]
    close(adv, expected)
    close(ret, expected)
    assert adv[3, 1].item() == 0.0  # masked token


def test_grpo_no_std_normalisation():
    adv, _ = ca.compute_grpo_outcome_advantage(t(GRPO_R), t(GRPO_M), GRPO_IDX, norm_adv_by_std_in_grpo=False)
    per_seq = [0.0, -1.0, 1.0, -1.0, 1.0, 0.5]
    close(adv, [[a * m for m in row] for a, row in zip(per_seq, GRPO_M)])


def test_grpo_interleaved_groups_and_list_index():
    # groups interleaved: x -> rows 0, 2 (scores 1, 3); y -> rows 1, 3 (scores 10, 10)
    # x: mean 2, std sqrt2 -> -1/sqrt2, 1/sqrt2 ; y: std 0 -> 0 / eps = 0
    r = t([[1.0], [10.0], [3.0], [10.0]])
    adv, _ = ca.compute_grpo_outcome_advantage(r, torch.ones(4, 1), ["x", "y", "x", "y"], epsilon=1e-6)
    s2 = math.sqrt(2)
    close(adv, [[-1 / (s2 + 1e-6)], [0.0], [1 / (s2 + 1e-6)], [0.0]])


def test_rloo():
    # a: 1 - (0+2)/2 = 0, 0 - (1+2)/2 = -1.5, 2 - (1+0)/2 = 1.5
    # b: 3 - 5 = -2, 5 - 3 = 2 ; c: singleton keeps its score 0.5
    adv, ret = ca.compute_rloo_outcome_advantage(t(GRPO_R), t(GRPO_M), GRPO_IDX)
    per_seq = [0.0, -1.5, 1.5, -2.0, 2.0, 0.5]
    expected = [[a * m for m in row] for a, row in zip(per_seq, GRPO_M)]
    close(adv, expected)
    close(ret, expected)


def test_compute_advantage_dispatch():
    adv, _ = compute_advantage("rloo", token_level_rewards=t(GRPO_R), response_mask=t(GRPO_M), index=GRPO_IDX)
    close(adv[:, 0], [0.0, -1.5, 1.5, -2.0, 2.0, 0.5])
    adv, _ = compute_advantage("grpo", token_level_rewards=t(GRPO_R), response_mask=t(GRPO_M), index=GRPO_IDX,
                                  norm_adv_by_std_in_grpo=False)
    close(adv[:, 0], [0.0, -1.0, 1.0, -1.0, 1.0, 0.5])
    _, ret = compute_advantage("gae", token_level_rewards=t([[0.0, 0.0, 1.0]]), response_mask=torch.ones(1, 3),
                                  values=t([[0.2, 0.4, 0.6]]), gamma=0.5, lam=0.5)
    close(ret, [[0.2, 0.4, 1.0]])


def test_compute_advantage_errors():
    with pytest.raises(ValueError, match=r"algorithm\.adv_estimator") as e:
        compute_advantage("ppo2", token_level_rewards=t(GRPO_R), response_mask=t(GRPO_M), index=GRPO_IDX)
    assert "gae" in str(e.value) and "grpo" in str(e.value) and "rloo" in str(e.value)
    with pytest.raises(ValueError, match="gae"):
        compute_advantage("gae", token_level_rewards=t(GRPO_R), response_mask=t(GRPO_M))
    with pytest.raises(ValueError, match="grpo"):
        compute_advantage("grpo", token_level_rewards=t(GRPO_R), response_mask=t(GRPO_M))


# ------------------------------------------------------------------------------------------------
# agg_loss
# ------------------------------------------------------------------------------------------------
def test_agg_loss_modes():
    # valid: row0 (1, 2), row1 (4)
    # token-mean 7/3; seq-mean-token-sum (3 + 4)/2 = 3.5; seq-mean-token-mean (1.5 + 4)/2 = 2.75
    close(ca.agg_loss(t(X), t(M), "token-mean"), 7 / 3)
    close(ca.agg_loss(t(X), t(M), "seq-mean-token-sum"), 3.5)
    close(ca.agg_loss(t(X), t(M), "seq-mean-token-mean"), 2.75)
    # token-sum 1 + 2 + 4 = 7; seq-mean-token-sum-norm: 3.5 / T (T = 3 columns) or / loss_scale_factor
    close(ca.agg_loss(t(X), t(M), "token-sum"), 7.0)
    close(ca.agg_loss(t(X), t(M), "seq-mean-token-sum-norm"), 3.5 / 3)
    close(ca.agg_loss(t(X), t(M), "seq-mean-token-sum-norm", loss_scale_factor=7), 0.5)


def test_agg_loss_with_empty_row():
    """verl: by itself a fully masked row is not a sequence (the rows with a token are averaged); given the
    mini-batch's row count (the trainer's global_batch_size, every row) it counts as a sequence of loss 0."""
    x = t(X + [[7.0, 8.0, 9.0]])
    m = t(M + [[0, 0, 0]])
    close(ca.agg_loss(x, m, "token-mean"), 7 / 3)
    close(ca.agg_loss(x, m, "token-sum"), 7.0)
    close(ca.agg_loss(x, m, "seq-mean-token-sum"), 3.5)  # (3 + 4) / 2 sequences with tokens
    close(ca.agg_loss(x, m, "seq-mean-token-mean"), 2.75)  # (1.5 + 4) / 2
    close(ca.agg_loss(x, m, "seq-mean-token-sum", global_batch_size=3), 7 / 3)  # (3 + 4 + 0) / 3 rows
    close(ca.agg_loss(x, m, "seq-mean-token-mean", global_batch_size=3), 5.5 / 3)  # (1.5 + 4 + 0) / 3
    close(ca.agg_loss(x, m, "seq-mean-token-sum-norm", global_batch_size=3), 7 / 3 / 3)


def test_agg_loss_global_counts():
    """A micro-batch divides by the mini-batch's counts and multiplies by dp_size (FSDP averages over ranks)."""
    close(ca.agg_loss(t(X), t(M), "token-mean", dp_size=2, batch_num_tokens=14), 7 / 14 * 2)
    close(ca.agg_loss(t(X), t(M), "token-sum", dp_size=2), 14.0)
    close(ca.agg_loss(t(X), t(M), "seq-mean-token-sum", dp_size=2, global_batch_size=8), 7 / 8 * 2)
    close(ca.agg_loss(t(X), t(M), "seq-mean-token-mean", dp_size=2, global_batch_size=8), 5.5 / 8 * 2)
    close(ca.agg_loss(t(X), t(M), "seq-mean-token-sum-norm", dp_size=2, global_batch_size=8,
                      loss_scale_factor=4), 7 / 8 * 2 / 4)


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match=r"actor\.loss_agg_mode"):
        ca.agg_loss(t(X), t(M), "seq-sum")


# ------------------------------------------------------------------------------------------------
# policy loss
# ------------------------------------------------------------------------------------------------
# ratios / advantages per token (cliprange 0.2, clip_ratio_c 3):
#   row0: (A=1, r=1.5) -> max(-1.5, -1.2) = -1.2 [clipped]
#         (A=1, r=0.5) -> max(-0.5, -0.8) = -0.5
#         (A=-1, r=0.5) -> max(0.5, 0.8) = 0.8 [clipped]; dual min(0.8, 3) = 0.8
#   row1: (A=-1, r=5) -> max(5, 1.2) = 5; dual min(5, 3) = 3 [lower-clipped]
#         (A=2, r=1.1) -> max(-2.2, -2.2) = -2.2
#         masked (A=100, r=10)
PL_RATIO = [[1.5, 0.5, 0.5], [5.0, 1.1, 10.0]]
PL_ADV = [[1.0, 1.0, -1.0], [-1.0, 2.0, 100.0]]
PL_MASK = [[1, 1, 1], [1, 1, 0]]


def _pl_inputs():
    old = torch.zeros(2, 3, dtype=F64)
    new = torch.log(t(PL_RATIO)).requires_grad_(True)
    return old, new, t(PL_ADV), t(PL_MASK)


def test_policy_loss_values():
    old, new, adv, m = _pl_inputs()
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = ca.compute_policy_loss(old, new, adv, m, cliprange=0.2)
    close(pg_loss, (-1.2 - 0.5 + 0.8 + 3.0 - 2.2) / 5)  # -0.02
    close(clipfrac, 2 / 5)
    close(clipfrac_lower, 1 / 5)
    # ppo_kl = mean(old - new) = -(ln1.5 + 2 ln0.5 + ln5 + ln1.1)/5 = -0.7239188392/5
    close(ppo_kl, -0.7239188392266991 / 5)


def test_policy_loss_gradient():
    old, new, adv, m = _pl_inputs()
    pg_loss, *_ = ca.compute_policy_loss(old, new, adv, m, cliprange=0.2)
    pg_loss.backward()
    # d/dlogp (-A r)/N = -A r / 5 on unclipped tokens; 0 on clipped / dual-clipped / masked ones
    close(new.grad, [[0.0, -0.5 / 5, 0.0], [0.0, -2.2 / 5, 0.0]])


def test_policy_loss_agg_modes():
    old, new, adv, m = _pl_inputs()
    # per-row sums: -0.9, 0.8 ; per-row means: -0.3, 0.4
    loss, *_ = ca.compute_policy_loss(old, new, adv, m, loss_agg_mode="seq-mean-token-sum")
    close(loss, (-0.9 + 0.8) / 2)
    loss, *_ = ca.compute_policy_loss(old, new, adv, m, loss_agg_mode="seq-mean-token-mean")
    close(loss, (-0.3 + 0.4) / 2)


def test_policy_loss_asymmetric_clip():
    old = torch.zeros(1, 2, dtype=F64)
    new = torch.log(t([[1.25, 0.75]]))
    adv = t([[1.0, -1.0]])
    m = torch.ones(1, 2)
    # symmetric 0.2: (A=1, r=1.25) -> -1.2 [clipped]; (A=-1, r=0.75) -> max(0.75, 0.8) = 0.8 [clipped]
    loss, clipfrac, _, _ = ca.compute_policy_loss(old, new, adv, m, cliprange=0.2)
    close(loss, (-1.2 + 0.8) / 2)
    close(clipfrac, 1.0)
    # clip-higher 0.28: r=1.25 is inside (0.8, 1.28) -> -1.25; the low side still clips at 0.8
    loss, clipfrac, _, _ = ca.compute_policy_loss(old, new, adv, m, cliprange=0.2, cliprange_low=0.2,
                                                   cliprange_high=0.28)
    close(loss, (-1.25 + 0.8) / 2)
    close(clipfrac, 0.5)


def test_policy_loss_rejects_bad_dual_clip():
    old, new, adv, m = _pl_inputs()
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ca.compute_policy_loss(old, new, adv, m, clip_ratio_c=1.0)


# ------------------------------------------------------------------------------------------------
# value loss
# ------------------------------------------------------------------------------------------------
def test_value_loss():
    # cliprange 0.5
    # tok1: V_old 0, v 1.0, R 2 -> clipped v 0.5: (1-2)^2 = 1, (0.5-2)^2 = 2.25 -> 2.25 [clipped]
    # tok2: V_old 0, v 1.0, R 0 -> clipped v 0.5: 1, 0.25 -> 1
    # tok3: V_old 1, v 1.2, R 1 -> inside: 0.04, 0.04 -> 0.04
    # tok4: masked
    vpreds = t([[1.0, 1.0, 1.2, 100.0]])
    returns = t([[2.0, 0.0, 1.0, 0.0]])
    values = t([[0.0, 0.0, 1.0, 0.0]])
    m = t([[1, 1, 1, 0]])
    vf_loss, vf_clipfrac = ca.compute_value_loss(vpreds, returns, values, m, cliprange_value=0.5)
    close(vf_loss, 0.5 * (2.25 + 1.0 + 0.04) / 3)
    close(vf_clipfrac, 1 / 3)
    vf_loss, _ = ca.compute_value_loss(vpreds, returns, values, m, 0.5, loss_agg_mode="seq-mean-token-sum")
    close(vf_loss, 0.5 * (2.25 + 1.0 + 0.04))


# ------------------------------------------------------------------------------------------------
# KL penalty
# ------------------------------------------------------------------------------------------------
def test_kl_penalty_types():
    logp = t([[-1.0, -2.0]])
    ref = t([[-2.0, -1.0]])
    for name in ("kl", "k1"):
        close(ca.kl_penalty(logp, ref, name), [[1.0, -1.0]])
    close(ca.kl_penalty(logp, ref, "abs"), [[1.0, 1.0]])
    for name in ("mse", "k2"):
        close(ca.kl_penalty(logp, ref, name), [[0.5, 0.5]])
    # k3: d = ref - logp = (-1, 1); exp(d) - d - 1 = (e^-1, e - 2)
    for name in ("low_var_kl", "k3"):
        close(ca.kl_penalty(logp, ref, name), [[math.exp(-1), math.e - 2]])


def test_kl_penalty_low_var_clamped():
    # d = 30 -> clamped to 20 before exp -> e^20 - 21 -> clamped to 10
    out = ca.kl_penalty(t([[-30.0]]), t([[0.0]]), "low_var_kl")
    close(out, [[10.0]])


def test_kl_penalty_unknown_names_key():
    with pytest.raises(ValueError, match=r"algorithm\.kl_penalty"):
        ca.kl_penalty(t([1.0]), t([1.0]), "full")
    with pytest.raises(ValueError, match=r"algorithm\.kl_penalty"):
        ca.kl_penalty(t([1.0]), t([1.0]), "k3++")
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.kl_loss_type"):
        ca.kl_penalty(t([1.0]), t([1.0]), "k4", key="actor_rollout_ref.actor.kl_loss_type")


# ------------------------------------------------------------------------------------------------
# logits helpers
# ------------------------------------------------------------------------------------------------
def test_entropy_from_logits():
    # uniform over 4 -> ln 4; logits (0, ln3) -> p = (1/4, 3/4):
    # H = 0.25 ln4 + 0.75 ln(4/3) = 0.3465735903 + 0.2157615544 = 0.5623351446
    # and logits (0, 0) -> ln 2
    ent = ca.entropy_from_logits(t([[[0.0, 0.0], [0.0, math.log(3)]]]))
    close(ent, [[math.log(2), 0.5623351446188083]])
    close(ca.entropy_from_logits(t([[0.0, 0.0, 0.0, 0.0]])), [math.log(4)])


def test_logprobs_from_logits():
    logits = t([[[0.0, math.log(3)], [0.0, math.log(3)]]])  # p = (1/4, 3/4)
    labels = torch.tensor([[1, 0]])
    close(ca.logprobs_from_logits(logits, labels), [[math.log(0.75), math.log(0.25)]])


def test_logits_helpers_chunked_and_bf16(monkeypatch):
    from rlx.algos import logits as logits_module

    monkeypatch.setattr(logits_module, "_LOGITS_ROW_CHUNK", 2)
    logits = torch.tensor([0.0, math.log(3)]).repeat(5, 1).reshape(1, 5, 2)  # 5 rows, 3 chunks
    labels = torch.tensor([[1, 0, 1, 0, 1]])
    lp = ca.logprobs_from_logits(logits, labels)
    close(lp, [[math.log(0.75), math.log(0.25)] * 2 + [math.log(0.75)]], tol=1e-6)
    ent = ca.entropy_from_logits(logits)
    close(ent, [[0.5623351446188083] * 5], tol=1e-6)
    lp16 = ca.logprobs_from_logits(logits.bfloat16(), labels)
    assert lp16.dtype == torch.float32
    close(lp16, lp, tol=1e-2)


def test_logprobs_gradient():
    # d/dz [z_y - logsumexp(z)] = onehot(y) - softmax(z) = (0, 1) - (1/4, 3/4)
    logits = t([[0.0, math.log(3)]]).requires_grad_(True)
    ca.logprobs_from_logits(logits, torch.tensor([1])).sum().backward()
    close(logits.grad, [[-0.25, 0.25]])


# ------------------------------------------------------------------------------------------------
# KL controllers and in-reward penalty
# ------------------------------------------------------------------------------------------------
def test_fixed_kl_controller():
    c = ca.FixedKLController(0.05)
    c.update(current_kl=100.0, n_steps=64)
    assert c.value == pytest.approx(0.05)


def test_adaptive_kl_controller():
    c = ca.AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    # kl 1.5: error clip(0.5) = 0.2 -> x(1 + 0.2*10/100) = x1.02
    c.update(current_kl=1.5, n_steps=10)
    assert c.value == pytest.approx(0.102)
    # kl 0.9: error -0.1 -> x(1 - 0.1*10/100) = x0.99
    c.update(current_kl=0.9, n_steps=10)
    assert c.value == pytest.approx(0.10098)


def test_get_kl_controller():
    assert isinstance(ca.get_kl_controller("fixed", 0.1), ca.FixedKLController)
    c = ca.get_kl_controller("adaptive", 0.1, target_kl=6.0, horizon=10000)
    assert isinstance(c, ca.AdaptiveKLController) and c.value == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.type"):
        ca.get_kl_controller("pid", 0.1)
    with pytest.raises(ValueError, match="horizon"):
        ca.get_kl_controller("adaptive", 0.1, target_kl=6.0, horizon=0)


def _kl_batch():
    scores = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old = torch.full((2, 3), -1.0, dtype=F64)
    ref = t([[-1.5, -1.0, -2.0], [-2.0, -1.5, 9.0]])
    m = t([[1, 1, 1], [1, 1, 0]])
    return scores, old, ref, m


def test_apply_kl_penalty_fixed():
    # kl = old - ref = [[0.5, 0, 1], [1, 0.5, (masked)]]
    # rewards = scores - 0.5*kl = [[-0.25, 0, 0.5], [-0.5, 1.75, 0]]
    # per-seq mean kl: 1.5/3 = 0.5, 1.5/2 = 0.75 -> batch 0.625
    scores, old, ref, m = _kl_batch()
    ctrl = ca.FixedKLController(0.5)
    rewards, metrics = ca.apply_kl_penalty(scores, old, ref, m, ctrl, "kl")
    close(rewards, [[-0.25, 0.0, 0.5], [-0.5, 1.75, 0.0]])
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.625)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.5)


def test_apply_kl_penalty_adaptive_updates_after_use():
    scores, old, ref, m = _kl_batch()
    ctrl = ca.AdaptiveKLController(init_kl_coef=0.5, target_kl=0.5, horizon=4)
    rewards, metrics = ca.apply_kl_penalty(scores, old, ref, m, ctrl, "kl")
    close(rewards, [[-0.25, 0.0, 0.5], [-0.5, 1.75, 0.0]])  # uses the pre-update coefficient
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.5)
    # error clip(0.625/0.5 - 1 = 0.25) = 0.2 ; n_steps = B = 2 -> x(1 + 0.2*2/4) = x1.1
    assert ctrl.value == pytest.approx(0.55)


def test_apply_kl_penalty_unknown_type():
    scores, old, ref, m = _kl_batch()
    with pytest.raises(ValueError, match=r"algorithm\.kl_penalty"):
        ca.apply_kl_penalty(scores, old, ref, m, ca.FixedKLController(0.1), "bogus")


def test_log_probs_of_no_token_stay_in_the_graph():
    """A rank whose micro-batch (or Ulysses slice) scores no token still runs backward through the model: its empty
    log-probs and entropy are functions of the logits, not detached zeros."""
    logits = torch.randn(0, 7, requires_grad=True)
    lp = ca.logprobs_from_logits(logits, torch.zeros(0, dtype=torch.long))
    ent = ca.entropy_from_logits(logits)
    assert lp.shape == ent.shape == (0,) and lp.requires_grad and ent.requires_grad
    (lp.sum() + ent.sum()).backward()
    assert logits.grad is not None and logits.grad.shape == (0, 7)
