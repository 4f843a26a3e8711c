"""Unit tests for rlx.algos.metrics against hand-computed values."""
import math

import numpy as np
import pytest
import torch

from rlx.algos.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reduce_metrics,
)


def _batch():
    # B = 2, P = 3, R = 4
    # row0: prompt has 2 tokens (left padded), response fills all 4 positions (clipped)
    # row1: prompt fills all 3 positions, response has 2 tokens
    attention_mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1],
                                   [1, 1, 1, 1, 1, 0, 0]])
    response_mask = attention_mask[:, 3:].clone()
    return {
        "prompts": torch.tensor([[0, 11, 12], [13, 14, 15]]),
        "responses": torch.tensor([[21, 22, 23, 24], [25, 26, 0, 0]]),
        "attention_mask": attention_mask,
        "response_mask": response_mask,
        # sequence scores: 1.0, 0.5
        "token_level_scores": torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.5, 0.0, 0.0]]),
        # sequence rewards: 0.8, 0.4
        "token_level_rewards": torch.tensor([[0.0, 0.0, 0.0, 0.8], [-0.1, 0.5, 0.0, 0.0]]),
        # valid: 1, 2, 3, 4, -1, -2 (99 are padding)
        "advantages": torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, -2.0, 99.0, 99.0]]),
        # valid: 1, 1, 1, 1, 0, 2
        "returns": torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 50.0, 50.0]]),
        # valid: 1, 1, 1, 1, 0, 1
        "values": torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, -7.0, -7.0]]),
    }


def test_data_metrics_with_critic():
    m = compute_data_metrics(_batch(), use_critic=True)
    expected = {
        "critic/score/mean": 0.75, "critic/score/max": 1.0, "critic/score/min": 0.5,
        "critic/rewards/mean": 0.6, "critic/rewards/max": 0.8, "critic/rewards/min": 0.4,
        "critic/advantages/mean": 7 / 6, "critic/advantages/max": 4.0, "critic/advantages/min": -2.0,
        "critic/returns/mean": 1.0, "critic/returns/max": 2.0, "critic/returns/min": 0.0,
        "critic/values/mean": 5 / 6, "critic/values/max": 1.0, "critic/values/min": 0.0,
        # returns - values = (0, 0, 0, 0, 0, 1): unbiased var = (5/36 + 25/36)/5 = 1/6
        # var(returns) = (0+0+0+0+1+1)/5 = 0.4  ->  1 - (1/6)/(0.4 + 1e-5)
        "critic/vf_explained_var": 0.5833437497395899,
        "response_length/mean": 3.0, "response_length/max": 4.0, "response_length/min": 2.0,
        "response_length/clip_ratio": 0.5,
        "prompt_length/mean": 2.5, "prompt_length/max": 3.0, "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 0.5,
    }
    assert set(m) == set(expected)
    for k, v in expected.items():
        assert m[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        assert isinstance(m[k], float), k


def test_data_metrics_without_critic():
    b = _batch()
    del b["values"]
    m = compute_data_metrics(b, use_critic=False)
    assert not any(k.startswith("critic/values") for k in m)
    assert "critic/vf_explained_var" not in m
    assert m["critic/advantages/mean"] == pytest.approx(7 / 6)
    assert m["response_length/clip_ratio"] == pytest.approx(0.5)


def test_data_metrics_needs_values_with_critic():
    b = _batch()
    del b["values"]
    with pytest.raises(KeyError):
        compute_data_metrics(b, use_critic=True)


def test_data_metrics_without_attention_mask_uses_response_mask():
    b = _batch()
    del b["attention_mask"]
    m = compute_data_metrics(b, use_critic=False)
    assert m["response_length/mean"] == pytest.approx(3.0)
    assert m["response_length/clip_ratio"] == pytest.approx(0.5)
    assert not any(k.startswith("prompt_length/") for k in m)


def test_data_metrics_no_valid_tokens_gives_nan():
    b = _batch()
    b["response_mask"] = torch.zeros(2, 4, dtype=torch.long)
    m = compute_data_metrics(b, use_critic=False)
    assert math.isnan(m["critic/advantages/mean"])


def test_timing_metrics():
    assert compute_timing_metrics({"gen": 1.5, "update_actor": 2}) == {
        "timing_s/gen": 1.5, "timing_s/update_actor": 2.0}


def test_throughput_metrics():
    m = compute_throughput_metrics(batch_tokens=1000, step_time=2.0, n_gpus=4)
    assert m["perf/total_num_tokens"] == 1000
    assert m["perf/time_per_step"] == pytest.approx(2.0)
    assert m["perf/throughput"] == pytest.approx(125.0)  # 1000 / (2 * 4)


def test_reduce_metrics_dict_of_lists():
    out = reduce_metrics({"a": [1, 2, 3], "b": [torch.tensor(2.0), np.float32(4.0)], "c": 5, "d": []})
    assert out == {"a": pytest.approx(2.0), "b": pytest.approx(3.0), "c": pytest.approx(5.0)}


def test_reduce_metrics_list_of_dicts():
    out = reduce_metrics([{"a": 1.0, "b": 2.0}, {"a": 3.0}])
    assert out == {"a": pytest.approx(2.0), "b": pytest.approx(2.0)}
