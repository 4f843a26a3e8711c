"""rlx.algos.policy_losses: each loss mode on a hand-computed case (value, gradient where the mode shapes it, the
metrics verl's mode reports), the KL estimators' `+` forms, and exact accumulation over micro-batches and ranks.

Expected numbers are written out (or as the arithmetic that gives them), never derived with the code under test.
"""
import math

import pytest
import torch

from rlx.algos import core_algos as ca
from rlx.algos import policy_losses as pl
from rlx.algos.policy_losses import PolicyLossParams

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


def close(actual, expected, tol=1e-6):
    actual = torch.as_tensor(actual, dtype=F64)
    expected = torch.as_tensor(expected, dtype=F64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=tol), (actual, expected)


def leaf(x):
    return t(x).requires_grad_(True)


def run(mode, old, new, adv, mask, agg="token-mean", **params):
    """(loss, d loss / d log_prob, metrics as floats)."""
    log_prob = leaf(new)
    loss, metrics = pl.get_policy_loss_fn(mode)(t(old), log_prob, t(adv), t(mask), agg,
                                                PolicyLossParams(**params))
    loss.backward()
    return loss.detach(), log_prob.grad, {k: float(v) for k, v in metrics.items()}


def test_registry_has_verls_modes():
    assert set(pl.LOSS_MODES) == {"vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo",
                                  "dppo_tv", "dppo_kl"}
    with pytest.raises(ValueError, match=r"policy_loss\.loss_mode"):
        pl.get_policy_loss_fn("ppo2")


def test_params_read_an_actor_config():
    from rlx.config.schema import ActorConfig, PolicyLossConfig

    cfg = ActorConfig(clip_ratio_low=0.1, tau_neg=2.0, policy_loss=PolicyLossConfig(dro_beta=0.3, clip_cov_ub=7.0))
    p = PolicyLossParams.of(cfg)
    assert (p.low, p.high, p.tau_pos, p.tau_neg, p.dro_beta, p.clip_cov_ub) == (0.1, 0.2, 1.0, 2.0, 0.3, 7.0)
    assert PolicyLossParams.of(None) == PolicyLossParams()  # verl's defaults
    assert PolicyLossParams(clip_ratio=0.3, clip_ratio_low=None).low == 0.3


def test_vanilla_is_the_ppo_clip_with_verls_metrics():
    # ratio e^0.5 = 1.6487 with A = 1 is clipped at 1.2: loss -1.2, pg_clipfrac 1, ppo_kl -0.5, no gradient
    loss, grad, m = run("vanilla", [[0.0]], [[0.5]], [[1.0]], [[1]])
    close(loss, -1.2)
    close(grad, [[0.0]])
    assert m == pytest.approx({"actor/pg_clipfrac": 1.0, "actor/ppo_kl": -0.5, "actor/pg_clipfrac_lower": 0.0})


def test_gspo_sequence_ratio():
    # valid log-ratios 0.2, -0.1 (the third token is masked): s = exp(0.05) on both tokens, A = 1
    old, new, adv, mask = [[0.0, 0.0, 0.0]], [[0.2, -0.1, 5.0]], [[1.0, 1.0, 1.0]], [[1, 1, 0]]
    loss, grad, m = run("gspo", old, new, adv, mask)
    s = math.exp(0.05)
    close(loss, -s)  # token-mean of (-s, -s)
    close(grad, [[-s / 2, -s / 2, 0.0]])  # d(-A s_t)/d log pi_t = -A s, over 2 tokens
    assert m == pytest.approx({"actor/pg_clipfrac": 0.0, "actor/ppo_kl": -0.05, "actor/pg_clipfrac_lower": 0.0})
    # GSPO's tiny clip range: s = 1.0513 > 1 + 0.01 -> clipped, no gradient
    loss, grad, m = run("gspo", old, new, adv, mask, clip_ratio_high=0.01)
    close(loss, -1.01)
    close(grad, [[0.0, 0.0, 0.0]])
    assert m["actor/pg_clipfrac"] == pytest.approx(1.0)


def test_sapo_soft_gate():
    # token 0: r = 1, A = +1, tau_pos = 1: gate = sigmoid(0) * 4 = 2 -> loss -2
    # token 1: r = e^0.5, A = -1, tau_neg = 1.05: gate = sigmoid(1.05 (e^0.5 - 1)) * 4 / 1.05 -> loss +gate
    loss, grad, m = run("sapo", [[0.0, 0.0]], [[0.0, 0.5]], [[1.0, -1.0]], [[1, 1]], agg="token-sum")
    g1 = 1 / (1 + math.exp(-1.05 * (math.exp(0.5) - 1))) * 4 / 1.05
    close(loss, (-2 + g1) / 2)  # always seq-mean-token-mean, whatever loss_agg_mode says
    # d/dlogp of -A * sigmoid(tau (r - 1)) * 4 / tau = -A * 4 * sig * (1 - sig) * r: token 0: -1, halved
    close(grad[0, 0], -0.5)
    assert m == pytest.approx({"actor/pg_clipfrac": 0.0, "actor/ppo_kl": -0.25, "actor/pg_clipfrac_lower": 0.0})


def test_gpg_is_reinforce_and_reports_nothing():
    loss, grad, m = run("gpg", [[9.0, 9.0]], [[-0.5, -1.0]], [[2.0, -1.0]], [[1, 1]])
    close(loss, 0.0)  # (-2 * -0.5 + 1 * -1.0) / 2
    close(grad, [[-1.0, 0.5]])  # -A / 2
    assert m == {}


def test_rollout_is_weights_multiply_the_token_losses():
    loss, _ = pl.gpg(t([[0.0, 0.0]]), t([[-0.5, -1.0]]), t([[2.0, -1.0]]), t([[1, 1]]), "token-mean", None,
                     rollout_is_weights=t([[2.0, 1.0]]))
    close(loss, 0.5)  # (2 * 1.0 + 1 * -1.0) / 2


COV_LOGP = [[-1.0, -2.0, -3.0, -4.0]]
COV_ADV = [[2.0, 0.0, 0.0, 0.0]]
# A - mean A = (1.5, -0.5, -0.5, -0.5); log pi - mean = (1.5, 0.5, -0.5, -1.5): covariance (2.25, -0.25, 0.25, 0.75)


def test_clip_cov_drops_the_gradient_of_high_covariance_tokens():
    # ratio 1 everywhere (nothing clipped by PPO); only token 0 lies in the band (1, 5): it is dropped
    loss, grad, m = run("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, [[1, 1, 1, 1]])
    close(loss, 0.0)
    close(grad, [[0.0, 0.0, 0.0, 0.0]])
    assert m == pytest.approx({"actor/pg_clipfrac": 0.25, "actor/ppo_kl": 0.0})
    # a band above every covariance: token 0 keeps its loss -A r = -2 and its gradient -A r / 4 = -0.5
    loss, grad, m = run("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, [[1, 1, 1, 1]], clip_cov_lb=3.0)
    close(loss, -0.5)
    close(grad, [[-0.5, 0.0, 0.0, 0.0]])
    assert m["actor/pg_clipfrac"] == 0.0


def test_kl_cov_penalises_the_largest_covariance_token():
    # max(1, int(4 * 0.0002)) = 1 token: token 0 (covariance 2.25); its log-ratio 0.1 adds 0.1 * |0.1|
    old = [[-1.1, -2.0, -3.0, -4.0]]
    loss, grad, m = run("kl_cov", old, COV_LOGP, COV_ADV, [[1, 1, 1, 1]])
    close(loss, (-2 * math.exp(0.1) + 0.1 * 0.1) / 4)
    close(grad, [[(-2 * math.exp(0.1) + 0.1) / 4, 0.0, 0.0, 0.0]])  # d|d|/dlogp = sign(d) = 1
    assert m == pytest.approx({"actor/ppo_kl": 0.1 / 4})  # mean |log ratio|, as verl


def test_geo_mean_clips_per_token_in_the_advantage_direction():
    # row 0, A = +1, log-ratios (0.1, 0.5): pessimistic min with the clip at 0.2 -> (0.1, 0.2), mean 0.15
    # row 1, A = -1, log-ratios (-0.3, 0.1): max with the clip at -0.2 -> (-0.2, 0.1), mean -0.05
    old = [[0.0, 0.0], [0.0, 0.0]]
    new = [[0.1, 0.5], [-0.3, 0.1]]
    adv = [[1.0, 1.0], [-1.0, -1.0]]
    loss, grad, m = run("geo_mean", old, new, adv, [[1, 1], [1, 1]])
    close(loss, (-math.exp(0.15) + math.exp(-0.05)) / 2)  # the mean over rows
    # row 0: d/dlogp_t of -exp(mean) = -exp(0.15) / 2 on the unclipped token, 0 on the clipped one; / 2 rows
    close(grad[0], [-math.exp(0.15) / 4, 0.0])
    assert m == pytest.approx({"actor/pg_clipfrac": 0.25, "actor/ppo_kl": -0.1, "actor/pg_clipfrac_lower": 0.25})


def test_dro():
    # -(A log pi - beta / 2 (log pi - log pi_old)^2) = -(-1 - 0.25 * 0.04) = 1.01; gradient -(A - beta d) = -0.9
    loss, grad, m = run("dro", [[-1.2]], [[-1.0]], [[1.0]], [[1]], dro_beta=0.5)
    close(loss, 1.01)
    close(grad, [[-0.9]])
    assert m == pytest.approx({"actor/ppo_kl": -0.2})
    with pytest.raises(ValueError, match="dro_beta"):
        run("dro", [[-1.2]], [[-1.0]], [[1.0]], [[1]])


def test_cispo_detached_clipped_weight():
    # token 0: r = e^0.5 clipped to 1.2, A = 1, log pi = -1 -> 1.2; token 1: r = 1, A = -1, log pi = -2 -> -2
    loss, grad, m = run("cispo", [[-1.5, -2.0]], [[-1.0, -2.0]], [[1.0, -1.0]], [[1, 1]])
    close(loss, (1.2 - 2.0) / 2)
    close(grad, [[-1.2 / 2, 1.0 / 2]])  # -sg(w) A / 2: the weight carries no gradient
    assert m == pytest.approx({"actor/pg_clipfrac": 0.5, "actor/ppo_kl": -0.25, "actor/pg_clipfrac_lower": 0.0})


# probabilities (old -> new) and advantages of the four DPPO tokens
DPPO_OLD = [[0.5, 0.5, 0.5, 0.1]]
DPPO_NEW = [[0.8, 0.6, 0.25, 0.4]]
DPPO_ADV = [[1.0, 1.0, -1.0, -1.0]]


def _dppo(mode):
    log = lambda rows: [[math.log(p) for p in row] for row in rows]  # noqa: E731
    return run(mode, log(DPPO_OLD), log(DPPO_NEW), DPPO_ADV, [[1, 1, 1, 1]])


def test_dppo_tv():
    # pi - pi_old = (0.3, 0.1, -0.25, 0.3): token 0 (> 0.2 with A > 0) and token 2 (< -0.2 with A < 0) masked out;
    # token 1: -1 * 1.2 * log 0.6; token 3: ratio 4 truncated at clip_ratio_c = 3: +3 * log 0.4
    loss, grad, m = _dppo("dppo_tv")
    close(loss, (-1.2 * math.log(0.6) + 3 * math.log(0.4)) / 4)
    close(grad, [[0.0, -1.2 / 4, 0.0, 3 / 4]])  # -A sg(min(r, 3)) valid / 4
    ppo_kl = -(math.log(1.6) + math.log(1.2) + math.log(0.5) + math.log(4.0)) / 4
    assert m == pytest.approx({"actor/pg_clipfrac": 0.5, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": 0.25})


def test_dppo_kl():
    # binary KL: token 0: 0.5 log(0.5/0.8) + 0.5 log(0.5/0.2) = 0.5 log 1.5625 = 0.223 > 0.2 and pi rose (A > 0):
    # masked; token 1: 0.5 log(1.0417) = 0.020 kept; token 2: 0.5 log(4/3) = 0.144 <= 0.2 kept (tv masked it);
    # token 3: pi rose with A < 0: kept
    loss, grad, m = _dppo("dppo_kl")
    close(loss, (-1.2 * math.log(0.6) + 0.5 * math.log(0.25) + 3 * math.log(0.4)) / 4)
    close(grad, [[0.0, -1.2 / 4, 0.5 / 4, 3 / 4]])
    assert m["actor/pg_clipfrac"] == pytest.approx(0.25) and m["actor/pg_clipfrac_lower"] == pytest.approx(0.25)


# ---- KL forms -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,value,grad,plus_grad", [
    # log pi = -1, log pi_ref = -1.5: d = 0.5; the + forms keep the value and take k2's gradient, d = 0.5
    ("k1", 0.5, 1.0, 0.5), ("kl", 0.5, 1.0, 0.5), ("abs", 0.5, 1.0, 0.5),
    ("k2", 0.125, 0.5, 0.5), ("mse", 0.125, 0.5, 0.5),
    # k3: e^-0.5 + 0.5 - 1 = 0.106531; its own gradient 1 - e^-0.5 = 0.393469
    ("k3", math.exp(-0.5) - 0.5, 1 - math.exp(-0.5), 0.5),
    ("low_var_kl", math.exp(-0.5) - 0.5, 1 - math.exp(-0.5), 0.5),
])
def test_kl_estimator_and_its_straight_through_form(kind, value, grad, plus_grad):
    for name, expected_grad in ((kind, grad), (kind + "+", plus_grad)):
        logp = leaf([-1.0])
        kl = ca.kl_penalty(logp, t([-1.5]), name)
        kl.sum().backward()
        close(kl.detach(), [value])
        close(logp.grad, [expected_grad])


# ---- exact accumulation -------------------------------------------------------------------------------------------
EXACT_MODES = [m for m in pl.LOSS_MODES if m not in ("clip_cov", "kl_cov")]  # those select tokens per micro-batch


def _random_batch(seed=0, rows=6, cols=5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, cols, generator=g, dtype=F64) * 2 - 0.1
    new = old + (torch.rand(rows, cols, generator=g, dtype=F64) - 0.5) * 0.6
    adv = torch.randn(rows, cols, generator=g, dtype=F64)
    mask = (torch.rand(rows, cols, generator=g) < 0.7).to(F64)
    mask[:, 0] = 1
    mask[2] = 0  # a fully masked row (a multi-turn rollout can make one)
    return old, new, adv, mask


@pytest.mark.parametrize("agg", ca.LOSS_AGG_MODES)
@pytest.mark.parametrize("mode", EXACT_MODES)
def test_micro_batches_and_ranks_add_up_to_the_mini_batch(mode, agg):
    """Split a mini-batch into micro-batches (and over 2 ranks, FSDP averaging their gradients): with the
    mini-batch's counts, the losses and gradients add up to the whole mini-batch's, for every aggregation."""
    old, new, adv, mask = _random_batch()
    params = PolicyLossParams(dro_beta=0.1)
    fn = pl.get_policy_loss_fn(mode)
    tokens, rows = float(mask.sum()), mask.shape[0]

    def loss_and_grad(splits, dp):
        lp = new.clone().requires_grad_(True)
        gb = ca.GlobalBatchInfo(dp_size=dp, batch_num_tokens=tokens, global_batch_size=rows, loss_scale_factor=7)
        ranks = [splits[:len(splits) // dp * (r + 1)][len(splits) // dp * r:] for r in range(dp)]
        per_rank = []
        for rank in ranks:
            total = 0.0
            for s, e in rank:
                loss, _ = fn(old[s:e], lp[s:e], adv[s:e], mask[s:e], agg, params, global_batch=gb)
                total = total + loss
            per_rank.append(total)
        mean = sum(per_rank) / dp  # FSDP's average over ranks
        mean.backward()
        return mean.detach(), lp.grad

    whole, whole_grad = loss_and_grad([(0, 6)], 1)
    micro, micro_grad = loss_and_grad([(0, 2), (2, 3), (3, 6)], 1)
    ranks, ranks_grad = loss_and_grad([(0, 1), (1, 3), (3, 4), (4, 6)], 2)
    close(micro, whole, 1e-10)
    close(micro_grad, whole_grad, 1e-10)
    close(ranks, whole, 1e-10)
    close(ranks_grad, whole_grad, 1e-10)
    assert whole_grad.abs().sum() > 0


def test_fully_masked_row_counts_as_a_sequence_in_the_trainer():
    """verl's trainer divides the seq-mean-* losses by every row of the mini-batch (ppo_mini_batch_size * n): a fully
    masked row lowers the loss; by itself (no global count) it is not counted."""
    loss_mat = t([[1.0, 3.0], [9.0, 9.0]])
    mask = t([[1, 1], [0, 0]])
    close(ca.agg_loss(loss_mat, mask, "seq-mean-token-mean"), 2.0)
    close(ca.agg_loss(loss_mat, mask, "seq-mean-token-mean", global_batch_size=2), 1.0)
    close(ca.agg_loss(loss_mat, mask, "seq-mean-token-sum", global_batch_size=2), 2.0)
