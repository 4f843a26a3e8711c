"""rlx.algos.advantages: every estimator by verl's name on a hand-computed case.

Groups: rows 0-2 answer prompt "a" (scores 1, 0, 2: mean 1, unbiased std 1), row 3 answers prompt "b" alone
(score 5). The score sits on a row's last valid token. Expected numbers are written out, or the arithmetic that
gives them.
"""
import math

import pytest
import torch

from rlx.algos import advantages as A
from rlx.algos.core_algos import sum_pi_squared_from_logits

F64 = torch.float64
IDX = ["a", "a", "a", "b"]
SCORES = [1.0, 0.0, 2.0, 5.0]
EPS = 1e-6


def t(x):
    return torch.tensor(x, dtype=F64)


def close(actual, expected, tol=1e-6):
    actual = torch.as_tensor(actual, dtype=F64)
    expected = torch.as_tensor(expected, dtype=F64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=tol), (actual, expected)


def outcome(mask=None):
    """Rewards [4, 2] with each score on the row's last valid token; mask all ones unless given."""
    mask = t(mask or [[1, 1]] * 4)
    rewards = torch.zeros_like(mask)
    for i, s in enumerate(SCORES):
        rewards[i, int(mask[i].nonzero().max())] = s
    return rewards, mask


def adv(name, rewards=None, mask=None, **kw):
    if rewards is None:
        rewards, mask = outcome()
    return A.compute_advantage(name, token_level_rewards=rewards, response_mask=mask, index=IDX, **kw)


def test_registry_is_verls():
    assert set(A.ADV_ESTIMATORS) == {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                     "remax", "opo", "gpg", "grpo_passk", "grpo_vectorized", "rloo_vectorized",
                                     "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo"}
    with pytest.raises(ValueError, match=r"algorithm\.adv_estimator"):
        adv("ppo2")


def test_grpo_vectorized_equals_grpo():
    a, r = adv("grpo_vectorized")
    # group a: (s - 1) / (1 + eps); b alone: mean 0, std 1 -> 5 / (1 + eps)
    close(a[:, 0], [0.0, -1 / (1 + EPS), 1 / (1 + EPS), 5 / (1 + EPS)])
    assert torch.equal(a, r)
    a, _ = adv("grpo_vectorized", norm_adv_by_std_in_grpo=False)
    close(a[:, 1], [0.0, -1.0, 1.0, 5.0])


def test_rloo_vectorized_gives_a_lone_response_zero():
    # (n s - sum) / (n - 1): (3 - 3) / 2, (0 - 3) / 2, (6 - 3) / 2; the lone row gets 0 (rloo keeps its 5)
    a, _ = adv("rloo_vectorized")
    close(a[:, 0], [0.0, -1.5, 1.5, 0.0])
    close(adv("rloo")[0][:, 0], [0.0, -1.5, 1.5, 5.0])


def test_reinforce_plus_plus_discounted_and_whitened():
    rewards = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    a, ret = A.compute_advantage("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    # returns: row 0: 0.25, 0.5, 1; row 1: 1, 2, (masked) 0
    close(ret, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])
    # valid returns' mean 0.95; deviations^2 sum 1.8 -> unbiased variance 1.8 / 4 = 0.45
    sd = math.sqrt(0.45 + 1e-8)
    close(a, [[(0.25 - 0.95) / sd, (0.5 - 0.95) / sd, (1 - 0.95) / sd], [(1 - 0.95) / sd, (2 - 0.95) / sd, 0.0]])


def test_reinforce_plus_plus_skips_masked_positions():
    # an observation token (mask 0) between two turns: its reward 5 is dropped, the return passes through it
    _, ret = A.compute_advantage("reinforce_plus_plus", token_level_rewards=t([[0.0, 5.0, 1.0]]),
                                 response_mask=t([[1, 0, 1]]), gamma=1.0)
    close(ret, [[1.0, 0.0, 1.0]])


def test_reinforce_plus_plus_baseline():
    a, _ = adv("reinforce_plus_plus_baseline")
    # s - group mean on both tokens: (0, 0, -1, -1, 1, 1, 5, 5): mean 10 / 8 = 1.25; squared deviations
    # 2 * (1.5625 + 5.0625 + 0.0625 + 14.0625) = 41.5; unbiased variance 41.5 / 7
    sd = math.sqrt(41.5 / 7 + 1e-8)
    close(a[:, 0], [(0 - 1.25) / sd, (-1 - 1.25) / sd, (1 - 1.25) / sd, (5 - 1.25) / sd])
    close(a[:, 1], a[:, 0])


def test_remax_subtracts_the_greedy_reward():
    a, ret = A.compute_advantage("remax", token_level_rewards=t([[0.0, 1.0, 0.5]]), response_mask=t([[1, 1, 0]]),
                                 reward_baselines=t([0.4]))
    close(ret, [[1.0, 1.0, 0.0]])  # reward-to-go of the valid rewards
    close(a, [[0.6, 0.6, 0.0]])
    with pytest.raises(ValueError, match="greedy"):
        A.compute_advantage("remax", token_level_rewards=t([[1.0]]), response_mask=t([[1]]))


def test_opo_length_weighted_baseline():
    rewards, mask = outcome([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]])
    a, _ = adv("opo", rewards, mask)
    # lengths 2, 1, 3: baseline (2 * 1 + 1 * 0 + 3 * 2) / 6 = 4/3; the lone row: baseline 0
    close(a[:, 0], [-1 / 3, -4 / 3, 2 / 3, 5.0])
    close(a[1], [-4 / 3, 0.0, 0.0])


def test_gpg_rescales_by_the_share_of_nonzero_scores():
    a, _ = adv("gpg")
    # 3 of 4 scores non-zero: alpha = 4/3; group means 1 and (alone) 0
    close(a[:, 0], [0.0, -4 / 3, 4 / 3, 20 / 3])


def test_grpo_passk_only_the_best_gets_an_advantage():
    rewards, mask = outcome()
    idx = ["a", "a", "a", "b"]
    with pytest.raises(ValueError, match="grpo_passk"):  # the lone prompt
        A.compute_advantage("grpo_passk", token_level_rewards=rewards, response_mask=mask, index=idx)
    rewards, mask = rewards[:3], mask[:3]
    a, _ = A.compute_advantage("grpo_passk", token_level_rewards=rewards, response_mask=mask, index=idx[:3])
    close(a[:, 0], [0.0, 0.0, 1 / (1 + EPS)])  # (2 - 1) / (std 1 + eps)
    a, _ = A.compute_advantage("grpo_passk", token_level_rewards=rewards * 3, response_mask=mask, index=idx[:3],
                               norm_adv_by_std_in_grpo=False)
    close(a[:, 1], [0.0, 0.0, 3.0])


def test_gdpo_normalises_each_component_in_its_group():
    idx, mask = ["a", "a", "a"], torch.ones(3, 1, dtype=F64)
    # component 1 (1, 0, 2): (0, -1, 1) / (1 + eps); component 2 (0, 0, 3): mean 1, std sqrt(3): (-1, -1, 2) / sqrt 3
    # weights (1, 0.5): (-0.5/sqrt3, -1 - 0.5/sqrt3, 1 + 1/sqrt3) = (-0.288675, -1.288675, 1.577350), mean 0,
    # unbiased variance 4.232051 / 2 = 2.116025, std 1.454656 -> whitened:
    a, _ = A.compute_advantage("gdpo", token_level_rewards=torch.zeros(3, 1, dtype=F64), response_mask=mask, index=idx,
                               reward_components=[t([1.0, 0.0, 2.0]), t([0.0, 0.0, 3.0])], reward_weights=[1.0, 0.5])
    close(a[:, 0], [-0.198449, -0.885897, 1.084346], tol=1e-5)
    # no components: GRPO of the total reward, whitened
    a, _ = A.compute_advantage("gdpo", token_level_rewards=t([[1.0], [0.0], [2.0]]), response_mask=mask, index=idx)
    close(a[:, 0], [0.0, -1.0, 1.0], tol=1e-5)  # (0, -1, 1) has mean 0 and unbiased variance 1
    with pytest.raises(ValueError, match="gdpo_reward_weights"):
        A.compute_advantage("gdpo", token_level_rewards=torch.zeros(3, 1), response_mask=mask, index=idx,
                            reward_components=[t([1.0, 0.0, 2.0])], reward_weights=[1.0, 2.0])


# optimal token baseline: pi = 0.5 on every token, sum pi^2 = 0.5 -> per-token weight 1 - 2 * 0.5 + 0.5 = 0.5
OTB = dict(old_log_probs=torch.full((2, 3), math.log(0.5), dtype=F64), sum_pi_squared=torch.full((2, 3), 0.5,
                                                                                                 dtype=F64))


def test_optimal_token_baseline():
    rewards, mask = t([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), t([[1, 1, 0], [1, 1, 0]])
    a, ret = A.compute_advantage("optimal_token_baseline", token_level_rewards=rewards, response_mask=mask,
                                 index=["a", "a"], **OTB)
    close(ret, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # W = (0.5, 1.0) on both rows: B_0 = (1 * 0.5 + 0) / 1.0 = 0.5, B_1 = (1 * 1.0) / 2.0 = 0.5
    close(a, [[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]])


def test_optimal_token_baseline_zero_tail():
    # row 0 is the one longest (2 tokens vs 1): past position 1 it has no baseline (B_1 would be 1 from itself)
    rewards, mask = t([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), t([[1, 1, 0], [1, 0, 0]])
    a, _ = A.compute_advantage("optimal_token_baseline", token_level_rewards=rewards, response_mask=mask,
                               index=["a", "a"], **OTB)
    close(a, [[0.5, 1.0, 0.0], [-0.5, 0.0, 0.0]])


def test_tir_optimal_token_baseline_counts_generated_tokens_only():
    # row 0 has an observation token at position 1: its 2nd generated token (position 2) shares row 1's position-1
    # baseline: W (0.5, 1.0) compacted on both rows: B = (0.5, 0.5) -> row 0: 0.5 at 0 and 2; row 1: -0.5, -0.5
    rewards, mask = t([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), t([[1, 0, 1], [1, 1, 0]])
    a, _ = A.compute_advantage("tir_optimal_token_baseline", token_level_rewards=rewards, response_mask=mask,
                               index=["a", "a"], **OTB)
    close(a, [[0.5, 0.0, 0.5], [-0.5, -0.5, 0.0]])
    # the positional one compares position 2 of row 0 with nothing but itself: B_2 = 1, advantage 0
    a, _ = A.compute_advantage("optimal_token_baseline", token_level_rewards=rewards, response_mask=mask,
                               index=["a", "a"], **OTB)
    close(a, [[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]])


def test_optimal_token_baseline_needs_sum_pi_squared():
    with pytest.raises(ValueError, match="calculate_sum_pi_squared"):
        A.compute_advantage("optimal_token_baseline", token_level_rewards=t([[1.0]]), response_mask=t([[1]]),
                            index=["a"], old_log_probs=t([[0.0]]))


def test_sum_pi_squared_from_logits():
    # logits (0, log 3): p = (1/4, 3/4): sum p^2 = 1/16 + 9/16 = 0.625
    close(sum_pi_squared_from_logits(t([[0.0, math.log(3.0)]])), [0.625])
