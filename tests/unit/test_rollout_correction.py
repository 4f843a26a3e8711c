"""algorithm.rollout_correction (verl's decoupled mode): importance weights, rejection masks and the metrics by
hand on a small batch, the weighted policy loss, and a GRPO run with them through the trainer."""
from __future__ import annotations

import math

import pytest
import torch

from rlx.algos import core_algos
from rlx.algos.rollout_correction import is_weights, offpolicy_metrics, parse_rs, rejection_mask, rollout_correction

from conftest import load_config

E = math.exp
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
ROLLOUT = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -3.0, 0.0]])
LOG_R = OLD - ROLLOUT  # [[0.5, -1, 0], [0, 2, (padding) 0]]


def close(t, rows):
    assert torch.allclose(t.float(), torch.tensor(rows, dtype=torch.float32), atol=1e-5), t


def test_token_is_truncated():
    w, m = is_weights(LOG_R, MASK, "token", 2.0)
    close(w, [[E(0.5), E(-1), 1.0], [1.0, 2.0, 0.0]])  # e^2 = 7.39 truncated at 2; padding 0
    assert m["rollout_is_mean"] == pytest.approx((E(0.5) + E(-1) + 1 + 1 + 2) / 5, rel=1e-5)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # raw e^2 > 2
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)  # raw e^-1 < 1/2
    assert m["rollout_is_max"] == pytest.approx(2.0) and m["rollout_is_min"] == pytest.approx(E(-1), rel=1e-5)
    # sequence means of the weights: row 0 (e^.5 + e^-1 + 1) / 3, row 1 (1 + 2) / 2
    s0, s1 = (E(0.5) + E(-1) + 1) / 3, 1.5
    assert m["rollout_is_seq_mean"] == pytest.approx((s0 + s1) / 2, rel=1e-5)
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(0.5, rel=1e-5)
    # raw sequence means: row 1 (1 + e^2) / 2 > 2
    assert m["rollout_is_seq_fraction_high"] == pytest.approx(0.5)


def test_sequence_is_and_icepop_and_batch_normalize():
    w, m = is_weights(LOG_R, MASK, "sequence", 2.0)
    close(w, [[E(-0.5)] * 3, [2.0, 2.0, 0.0]])  # exp(sum log r): e^-0.5, e^2 -> 2
    assert m["rollout_is_max"] == pytest.approx(E(2), rel=1e-5)  # the raw sequence ratio
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    # IcePop [0.5, 5]: e^-1 and e^2 out of bounds -> 0
    w, m = is_weights(LOG_R, MASK, "token", "0.5_5.0")
    close(w, [[E(0.5), 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 5)
    # batch normalisation: divided by the mean over valid tokens / over responses
    w, m = is_weights(LOG_R, MASK, "token", 2.0, batch_normalize=True)
    mean = (E(0.5) + E(-1) + 1 + 1 + 2) / 5
    close(w, [[E(0.5) / mean, E(-1) / mean, 1 / mean], [1 / mean, 2 / mean, 0.0]])
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(mean, rel=1e-5)
    w, m = is_weights(LOG_R, MASK, "sequence", 2.0, batch_normalize=True)
    mean = (E(-0.5) + 2.0) / 2
    close(w, [[E(-0.5) / mean] * 3, [2 / mean, 2 / mean, 0.0]])


@pytest.mark.parametrize("options,threshold,kept,seq_fraction", [
    # k1 = -log r = [[-0.5, 1, 0], [0, -2, 0]] within [log 0.5, log 2] = [-0.69, 0.69]
    ("token_k1", "0.5_2.0", [[1, 0, 1], [1, 0, 0]], 1.0),
    ("token_k1", 2.0, [[1, 0, 1], [1, 0, 0]], 1.0),  # an upper ratio bound: the lower is 1/2
    # k2 = (log r)^2 / 2 = [[0.125, 0.5, 0], [0, 2, 0]]: sums 0.625 and 2 -> row 1 rejected
    ("seq_sum_k2", 1.0, [[1, 1, 1], [0, 0, 0]], 0.5),
    ("seq_mean_k2", 0.3, [[1, 1, 1], [0, 0, 0]], 0.5),  # means 0.2083 and 1
    # k3 = r - 1 - log r = [[0.1487, 0.3679, 0], [0, 4.389, 0]]: max per row 0.3679 and 4.389
    ("seq_max_k3", 0.2, [[0, 0, 0], [0, 0, 0]], 1.0),
    ("token_k3", 0.2, [[1, 0, 1], [1, 0, 0]], 1.0),
    ("token_k1,seq_sum_k2", "0.5_2.0,1.0", [[1, 0, 1], [0, 0, 0]], 1.0),  # every option must accept
])
def test_rejection_masks(options, threshold, kept, seq_fraction):
    mask, m = rejection_mask(LOG_R, MASK, options, threshold)
    assert mask.tolist() == kept and mask.dtype == MASK.dtype
    rejected = 5 - sum(map(sum, kept))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(rejected / 5)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(seq_fraction)
    first = options.split(",")[0]
    for suffix in ("mean", "max", "min", "std", "fraction_high", "fraction_low", "seq_mean", "masked_fraction"):
        assert f"rollout_rs_{first}_{suffix}" in m


def test_rejection_statistics_by_hand():
    _, m = rejection_mask(LOG_R, MASK, "seq_sum_k2", 1.0)
    assert m["rollout_rs_seq_sum_k2_max"] == pytest.approx(2.0) and m["rollout_rs_seq_sum_k2_min"] == pytest.approx(
        0.625)
    assert m["rollout_rs_seq_sum_k2_fraction_high"] == pytest.approx(0.5)
    assert m["rollout_rs_seq_sum_k2_seq_mean"] == pytest.approx(1.3125)
    _, m = rejection_mask(LOG_R, MASK, "token_k2", 1.0)
    assert m["rollout_rs_token_k2_mean"] == pytest.approx((0.125 + 0.5 + 2.0) / 5)
    assert m["rollout_rs_token_k2_fraction_high"] == pytest.approx(1 / 5)


@pytest.mark.parametrize("options,threshold,message", [
    ("token_k4", 1.0, "options must be among"),
    ("token_k2", None, "give a threshold"),
    ("token_k2", "0.1_1", "not valid for token_k2"),
    ("token_k1,token_k2", "1,2,3", "one per rollout_rs option"),
])
def test_rejection_options_refused(options, threshold, message):
    with pytest.raises(ValueError, match=message):
        parse_rs(options, threshold)


def test_offpolicy_metrics_by_hand():
    m = offpolicy_metrics(OLD, ROLLOUT, MASK)
    assert m["kl"] == pytest.approx(-(0.5 - 1 + 0 + 0 + 2) / 5)
    assert m["k3_kl"] == pytest.approx((E(0.5) - 1.5 + E(-1) - 1 + 1 + E(2) - 3) / 5, rel=1e-5)
    lp_old, lp_roll = [-3.5 / 3, -1.0], [-3.0 / 3, -4.0 / 2]
    assert m["training_ppl"] == pytest.approx((E(3.5 / 3) + E(1)) / 2, rel=1e-5)
    assert m["rollout_ppl"] == pytest.approx((E(1) + E(2)) / 2, rel=1e-5)
    diffs = [r - o for r, o in zip(lp_roll, lp_old)]  # [1/6, -1]
    assert m["log_ppl_diff"] == pytest.approx(sum(diffs) / 2, rel=1e-5)
    assert m["log_ppl_diff_max"] == pytest.approx(1 / 6, rel=1e-5)
    assert m["chi2_token"] == pytest.approx((E(1) + E(-2) + 1 + 1 + E(4)) / 5 - 1, rel=1e-5)
    assert m["chi2_seq"] == pytest.approx((E(-1) + E(4)) / 2 - 1, rel=1e-5)


def test_rollout_correction_combines_with_verls_metric_names():
    w, mask, m = rollout_correction(OLD, ROLLOUT, MASK, "token", 2.0, False, "token_k1", "0.5_2.0")
    close(w, [[E(0.5), E(-1), 1.0], [1.0, 2.0, 0.0]])  # weights over the original mask
    assert mask.tolist() == [[1, 0, 1], [1, 0, 0]]
    assert all(k.startswith("rollout_corr/") for k in m)
    for key in ("rollout_is_mean", "rollout_is_eff_sample_size", "rollout_rs_masked_fraction", "kl", "k3_kl",
                "training_ppl", "rollout_ppl", "chi2_token", "chi2_seq", "ppl_ratio"):
        assert f"rollout_corr/{key}" in m, key
    w, mask, m = rollout_correction(OLD, ROLLOUT, MASK, None, 2.0, False, None, None)  # diagnostics only
    assert w is None and torch.equal(mask, MASK) and "rollout_corr/kl" in m and "rollout_corr/rollout_is_mean" not in m


def test_policy_loss_multiplied_by_the_weights():
    lp = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -2.0]])
    args = dict(old_log_prob=lp, log_prob=lp, advantages=adv, response_mask=torch.ones(1, 2))
    # ratio 1: per-token losses -A = [-1, 2]; with weights [0.5, 2]: [-0.5, 4]; token-mean
    assert core_algos.compute_policy_loss(**args)[0].item() == pytest.approx(0.5)
    assert core_algos.compute_policy_loss(**args, rollout_is_weights=torch.tensor([[0.5, 2.0]]))[0].item() == \
        pytest.approx(1.75)


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.rollout_correction.rollout_is=token"], "calculate_log_probs=True"),
    (["algorithm.rollout_correction.rollout_is=tokens", "actor_rollout_ref.rollout.calculate_log_probs=True"],
     "rollout_is='tokens'"),
    (["algorithm.rollout_correction.rollout_rs=token_k1", "actor_rollout_ref.rollout.calculate_log_probs=True"],
     "give a threshold"),
    (["algorithm.rollout_correction.bypass_mode=True"], "bypass_mode"),
])
def test_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(overrides)


# ---- bypass mode: the rollout's log-probs are the old ones, the correction computed in the loss ----------------
def _bypass(loss_type, **correction):
    from rlx.algos.policy_losses import get_policy_loss_fn
    from rlx.algos.rollout_correction import bypass_policy_loss

    log_prob = torch.tensor([[math.log(1.5), math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    corr = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=False, rollout_rs=None,
                rollout_rs_threshold=None)
    corr.update(correction)
    loss, metrics = bypass_policy_loss(get_policy_loss_fn("vanilla"), torch.zeros(1, 2, dtype=torch.float64),
                                       log_prob, torch.tensor([[1.0, -2.0]], dtype=torch.float64),
                                       torch.ones(1, 2, dtype=torch.float64), "token-mean", None, None, loss_type,
                                       corr)
    loss.backward()
    return loss.item(), log_prob.grad, metrics


def test_bypass_reinforce_by_hand():
    # w = pi / pi_rollout = [1.5, 0.5] (under the 2.0 truncation), no gradient through w;
    # losses -A * log pi * w = [-ln1.5 * 1.5, 2 * ln0.5 * 0.5], token-mean; d/dlog pi = -A * w / 2 = [-0.75, 0.5]
    loss, grad, metrics = _bypass("reinforce")
    assert loss == pytest.approx((-math.log(1.5) * 1.5 + 2 * math.log(0.5) * 0.5) / 2)
    assert torch.allclose(grad, torch.tensor([[-0.75, 0.5]], dtype=torch.float64))
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)


def test_bypass_ppo_clip_by_hand():
    # ratio pi / pi_rollout = [1.5, 0.5], clip 0.2: A=1 -> max(-1.5, -1.2) = -1.2 (clipped: no gradient);
    # A=-2 -> max(2 * 0.5, 2 * 0.8) = 1.6 (clipped), under the dual clip 6: token-mean 0.2; the IS weights are
    # not applied (the ratio is the correction), only reported
    loss, grad, metrics = _bypass("ppo_clip")
    assert loss == pytest.approx(0.2)
    assert torch.equal(grad, torch.zeros(1, 2, dtype=torch.float64))
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(1.0)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)


def test_bypass_rejection_leaves_tokens_out_of_the_loss():
    # token_k1 (verl's k1 = log pi_rollout - log pi, bounds on its exp) with 0.4_1.4: exp(k1) = [1/1.5, 2.0], the
    # second token is rejected; REINFORCE on the first alone: -ln1.5 * 1.5 over one token, d/dlog pi = -A * w = -1.5
    loss, grad, metrics = _bypass("reinforce", rollout_rs="token_k1", rollout_rs_threshold="0.4_1.4")
    assert loss == pytest.approx(-math.log(1.5) * 1.5)
    assert grad[0, 0] == pytest.approx(-1.5) and grad[0, 1] == 0
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
