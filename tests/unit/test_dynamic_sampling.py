"""DAPO's dynamic sampling (algorithm.filter_groups, data.gen_batch_size) and PF-PPO's resampling
(algorithm.use_pf_ppo): the group filter, the rounds and the weights by hand, then GRPO runs through the trainer."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlx.algos.pf_ppo import pf_ppo_weights, resample_indices
from rlx.config.schema import FilterGroupsConfig
from rlx.protocol import Batch
from rlx.trainer.dynamic_sampling import DynamicSampling, NotEnoughGroups, kept_uids, metric_values

from conftest import load_config


def test_kept_uids_by_hand():
    uids = ["a", "a", "b", "b", "c", "d", "d", "d"]
    values = [1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5]
    # a: all 1 (dropped); b: 0 and 1 (kept); c: one response (kept, as in verl); d: all 0.5 (dropped)
    assert kept_uids(uids, values) == ["b", "c"]
    assert kept_uids([], []) == []


def _round(uids: list[str], scores: list[float], extra: dict | None = None):
    """A scored round: response i has its score on its last token (the rest of the row is 0)."""
    t = torch.zeros(len(uids), 3)
    t[:, -1] = torch.tensor(scores)
    batch = Batch({"token_level_scores": t, "row": torch.arange(len(uids))},
                  {"uid": np.array(uids, dtype=object)})
    return batch, extra or {}


def test_metric_values():
    batch, _ = _round(["a", "a"], [0.25, 1.0])
    for metric in ("reward", "seq_reward", "seq_final_reward"):
        assert metric_values(batch, {}, metric).tolist() == [0.25, 1.0]
    assert metric_values(batch, {}, "acc").tolist() == [0.25, 1.0]  # a function returning numbers: acc = score
    assert metric_values(batch, {"acc": [True, False]}, "acc").tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="metric='acc'.*'pred'"):
        metric_values(batch, {"pred": ["1", "2"], "score": [0.0, 1.0]}, "acc")
    # a function returning numbers, with the overlong extras logged: acc and score are still its score
    logged = {"overlong_reward": [0.0, 0.0], "overlong": [0.0, 0.0]}
    assert metric_values(batch, logged, "acc").tolist() == metric_values(batch, logged, "score").tolist() == [0.25, 1]


def test_filter_by_score_of_a_dict_function_as_verl():
    """metric=score with a function returning {'score', ...} (verl's DAPO recipe): the dict's score before the
    overlong penalty. Group a: scores 1, 1 but different lengths (penalties): dropped by score, kept by reward."""
    from rlx.reward.manager import RewardManager
    from rlx.models import build_byte_tokenizer
    from unit.test_reward import _batch

    tok = build_byte_tokenizer()
    batch = _batch(tok, ["yes", "yes and more", "yes", "no"], sources=["d"] * 4, truths=["yes"] * 4)
    batch.non_tensors["uid"] = np.array(["a", "a", "b", "b"], dtype=object)
    fn = lambda data_source, solution_str, ground_truth, extra_info=None: {  # noqa: E731
        "score": float(solution_str.startswith(ground_truth)), "pred": solution_str[:3]}
    buffer = dict(enable=True, len=6, penalty_factor=1.0, log=False)
    scores, extra = RewardManager(tok, fn, overlong_buffer=buffer, max_resp_len=10)(batch)
    assert extra["score"] == [1.0, 1.0, 1.0, 0.0]
    batch.tensors["token_level_scores"] = scores
    assert kept_uids(batch["uid"], metric_values(batch, extra, "score")) == ["b"]
    assert kept_uids(batch["uid"], metric_values(batch, extra, "reward")) == ["a", "b"]  # the penalty varies


def test_fill_collects_rounds_until_enough_groups():
    rounds = iter([
        _round(["c", "c", "d", "d", "e", "e"], [0.0, 1.0, 1.0, 1.0, 0.0, 0.5]),  # c kept, d dropped, e kept
        _round(["f", "f"], [0.0, 1.0]),  # never asked for
    ])
    first = _round(["a", "a", "b", "b"], [1.0, 1.0, 0.0, 1.0])  # a dropped, b kept
    sampler = DynamicSampling(FilterGroupsConfig(enable=True, metric="seq_reward"), train_batch_size=2, n=2)
    metrics = {}
    out = sampler.fill(first, lambda: next(rounds), metrics)
    # kept in order: b (round 1), c, e (round 2); cut to 2 groups x 2 responses = b, c
    assert out["uid"].tolist() == ["b", "b", "c", "c"]
    assert out["token_level_scores"][:, -1].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert metrics == {"train/num_gen_batches": 2, "train/filter_groups/kept_ratio": 3 / 5}
    assert next(rounds)[0]["uid"].tolist() == ["f", "f"]


def test_fill_off_returns_the_first_round_and_limit_raises():
    first = _round(["a", "a"], [1.0, 1.0])
    off = DynamicSampling(FilterGroupsConfig(enable=False), train_batch_size=1, n=2)
    metrics = {}
    assert off.fill(first, lambda: pytest.fail("no second round when off"), metrics) is first[0]
    assert metrics == {}
    calls = []

    def more():
        calls.append(1)
        return _round(["x", "x"], [0.0, 0.0])

    limited = DynamicSampling(FilterGroupsConfig(enable=True, max_num_gen_batches=3), train_batch_size=1, n=2)
    with pytest.raises(NotEnoughGroups, match="3 generation rounds kept 0 groups.*max_num_gen_batches=3"):
        limited.fill(first, more, {})
    assert len(calls) == 2  # 3 rounds in all: the first and two more
    # 0: no limit -- stops as soon as a group with a spread arrives (the 6th round)
    rounds = iter([_round(["x", "x"], [0.0, 0.0])] * 4 + [_round(["y", "y"], [0.0, 1.0])])
    metrics = {}
    out = DynamicSampling(FilterGroupsConfig(enable=True, max_num_gen_batches=0), 1, 2).fill(
        first, lambda: next(rounds), metrics)
    assert out["uid"].tolist() == ["y", "y"] and metrics["train/num_gen_batches"] == 6


@pytest.mark.parametrize("overrides,message", [
    (["data.gen_batch_size=32"], "without algorithm.filter_groups.enable"),
    (["data.gen_batch_size=0", "algorithm.filter_groups.enable=True"], "data.gen_batch_size=0"),
    (["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=seq_final_reward",
      "algorithm.use_kl_in_reward=True"], "seq_final_reward"),
    (["algorithm.pf_ppo.reweight_method=square"], "algorithm.pf_ppo.reweight_method='square'"),
])
def test_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(overrides)
    load_config(["data.gen_batch_size=48", "algorithm.filter_groups.enable=True"])  # accepted


def test_pf_ppo_weights_by_hand():
    s = torch.tensor([-2.0, 0.0, 1.0, 3.0, 3.0])
    eps = 1e-8
    assert torch.allclose(pf_ppo_weights(s, "pow", 2.0), torch.tensor([4.0, 0.0, 1.0, 9.0, 9.0]) + eps)
    assert torch.allclose(pf_ppo_weights(s, "pow", 0.5), torch.tensor([2 ** 0.5, 0.0, 1.0, 3 ** 0.5, 3 ** 0.5]) + eps)
    assert pf_ppo_weights(s, "max_min", 2.0).tolist() == pytest.approx([1 + eps, eps, eps, 1 + eps, 1 + eps])
    assert pf_ppo_weights(s, "max_random", 2.0).tolist() == pytest.approx([0.1, 0.1, 0.1, 0.4, 0.4])
    with pytest.raises(ValueError, match="reweight_method='square'"):
        pf_ppo_weights(s, "square", 2.0)


def test_pf_ppo_resampling_draws_in_proportion():
    # weights 4, ~0, 1, 9, 9 (sum 23): a zero score is (almost) never drawn
    s = torch.tensor([-2.0, 0.0, 1.0, 3.0, 3.0])
    g = torch.Generator().manual_seed(0)
    draws = torch.cat([resample_indices(s, "pow", 2.0, generator=g) for _ in range(4000)])
    assert draws.shape == (20000,)
    freq = torch.bincount(draws, minlength=5).double() / draws.numel()
    assert torch.allclose(freq, torch.tensor([4, 0, 1, 9, 9]).double() / 23, atol=0.01), freq
    assert freq[1] == 0


REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # prompts with an even target digit: 1.0 for every response (no spread: filtered); odd: 0 or 0.5 by length
    if int(ground_truth) % 2 == 0:
        return 1.0
    return 0.5 * (len(solution_str) % 2)
'''
