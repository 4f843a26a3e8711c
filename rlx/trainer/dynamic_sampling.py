"""DAPO's dynamic sampling (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", §3.2),
as verl's DAPO trainer does it (`algorithm.filter_groups`, `data.gen_batch_size`).

A group (one prompt's rollout.n responses, one `uid`) whose metric is the same for every response has zero
advantage under a group baseline and teaches nothing. Each step: generate a round of gen_batch_size prompts,
score it, drop those groups (a group of one response is kept), and generate further rounds until
train_batch_size groups are kept; then keep the first train_batch_size groups. When the rounds allowed
(`max_num_gen_batches` > 0) are used up first, the step fails (the data is too easy or too hard).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from rlx.config.schema import FilterGroupsConfig
from rlx.protocol import Batch

SUMMED_SCORE_METRICS = ("reward", "seq_reward", "seq_final_reward")  # the sum of each response's token scores
Round = tuple[Batch, dict]  # a generated, scored round: the batch (with token_level_scores) and the reward extras


class NotEnoughGroups(RuntimeError):
    """The generation rounds allowed per step ran out before enough groups with a spread were kept."""


def metric_values(batch: Batch, extra: dict, metric: str) -> np.ndarray:
    """Each response's value of `metric`: the summed token scores, or the score function's `extra[metric]` (a
    function returning a dict: every key of it, `score` included, as the function gave it). A function returning
    plain numbers has no dict: `acc` and `score` are then its score, as in verl's reward loop (here the summed token
    scores, which also hold a DAPO overlong penalty when one is on)."""
    plain = "score" not in extra  # the reward manager adds `score` whenever the function returned a dict
    if metric in SUMMED_SCORE_METRICS or (metric in ("acc", "score") and metric not in extra and plain):
        return batch["token_level_scores"].sum(-1).double().cpu().numpy()
    if metric not in extra:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r} is not among what the score function returned "
                         f"({sorted(extra) or 'a number, no dict'}); use reward, seq_reward or one of those keys")
    return np.asarray(extra[metric], dtype=np.float64)


def kept_uids(uids, values) -> list:
    """The groups (in order of first appearance) whose values are not all equal, or that hold one response."""
    groups: dict = {}
    for uid, value in zip(uids, values):
        groups.setdefault(uid, []).append(float(value))
    return [uid for uid, vals in groups.items() if len(vals) == 1 or float(np.std(vals)) > 0]


class DynamicSampling:
    """`fill(first, more)` returns the step's training batch: `first` as it is when filtering is off, else the kept
    groups of `first` and of as many `more()` rounds as it takes, cut to `train_batch_size` groups."""

    def __init__(self, cfg: FilterGroupsConfig, train_batch_size: int, n: int):
        self.enable, self.metric, self.max_rounds = cfg.enable, cfg.metric, cfg.max_num_gen_batches
        self.train_batch_size, self.n = train_batch_size, n

    def fill(self, first: Round, more: Callable[[], Round], metrics: dict) -> Batch:
        if not self.enable:
            return first[0]
        kept: list[Batch] = []
        num_groups, rounds, generated = 0, 0, 0
        batch, extra = first
        while True:
            rounds += 1
            uids = batch["uid"]
            keep = set(kept_uids(uids, metric_values(batch, extra, self.metric)))
            generated += len(dict.fromkeys(uids))
            num_groups += len(keep)
            kept.append(batch.index([i for i, uid in enumerate(uids) if uid in keep]))
            if num_groups >= self.train_batch_size:
                break
            if 0 < self.max_rounds <= rounds:
                raise NotEnoughGroups(
                    f"{rounds} generation rounds kept {num_groups} groups whose algorithm.filter_groups.metric="
                    f"{self.metric!r} varies, fewer than data.train_batch_size={self.train_batch_size}; "
                    f"algorithm.filter_groups.max_num_gen_batches={self.max_rounds} allows no more. Check the data "
                    f"(too easy or too hard for the model), or raise max_num_gen_batches (0: no limit).")
            batch, extra = more()
        metrics["train/num_gen_batches"] = rounds
        metrics["train/filter_groups/kept_ratio"] = num_groups / generated
        return Batch.concat(kept).slice(0, self.train_batch_size * self.n)
