"""The reward manager: turns generated responses into token-level scores.

Reward managers (`reward_model.reward_manager`, verl's names): `naive` scores each response and puts the score on
its last valid token; `dapo` adds DAPO's overlong penalty (`reward_kwargs.overlong_buffer_cfg`); `batch` calls the
score function once per batch with lists. The score function is rlx.reward.functions' (`load_reward_fn`).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable

import numpy as np
import torch

from rlx.config.schema import RLXConfig
from rlx.protocol import Batch
from rlx.reward.functions import default_compute_score, describe_fn

logger = logging.getLogger(__name__)


class RewardError(ValueError):
    """A score function returned something that is not a finite number (names the function and the sample)."""


class RewardManager:
    """Decodes each response, scores it, and puts the score on its last valid response token.

    The value that picks the reward function is the batch's `data_source` (the dataset stores there the column
    that `data.reward_fn_key` names). A score must be a finite number (or a dict with one under "score"): anything
    else is a `RewardError` naming the function, the value, the data_source and the sample, so that no step trains
    on a garbage reward. With `non_finite_score` set (`reward_model.non_finite_score`), NaN/inf scores are replaced
    by it instead and counted in `non_finite_count` (of the last call).

    `overlong_buffer` (verl's dapo `overlong_buffer_cfg`: enable, len, penalty_factor, log) adds DAPO's soft
    overlong penalty: a response of L valid tokens, L > max_resp_len - len, gets
    ``-(L - (max_resp_len - len)) / len * penalty_factor`` added to its score. `batched` calls the score function
    once with lists (verl's batch manager): ``fn(data_sources, solution_strs, ground_truths, extra_infos)``.
    """

    def __init__(self, tokenizer, compute_score: Callable | None = None, non_finite_score: float | None = None,
                 overlong_buffer: dict | None = None, max_resp_len: int | None = None, batched: bool = False):
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.non_finite_score = non_finite_score
        self.non_finite_count = 0
        self.overlong_buffer = overlong_buffer if overlong_buffer and overlong_buffer.get("enable") else None
        if self.overlong_buffer is not None:
            assert max_resp_len is not None, "the overlong penalty needs max_resp_len"
            expected = max_resp_len - int(self.overlong_buffer["len"])
            if expected < 0:
                logger.warning("reward_model.reward_kwargs.overlong_buffer_cfg.len=%s exceeds max_resp_len=%s: every "
                               "response is penalised", self.overlong_buffer["len"], max_resp_len)
        self.max_resp_len = max_resp_len
        self.batched = batched

    def overlong_reward(self, length: int) -> float:
        """DAPO's soft overlong punishment of a response with `length` valid tokens (0 when off or short)."""
        if self.overlong_buffer is None:
            return 0.0
        buffer_len = int(self.overlong_buffer["len"])
        exceed = length - (self.max_resp_len - buffer_len)
        return min(-exceed / buffer_len * float(self.overlong_buffer["penalty_factor"]), 0.0)

    def _to_score(self, result, i: int, source) -> float:
        value = result.get("score") if isinstance(result, dict) else result
        where = f"sample {i} (data_source={source!r})"
        if isinstance(result, dict) and "score" not in result:
            raise RewardError(f"reward function {describe_fn(self.compute_score)} returned a dict without a 'score' "
                              f"key for {where}: keys {sorted(result)}")
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError("a string")
            score = float(value)
        except (TypeError, ValueError) as e:
            raise RewardError(f"reward function {describe_fn(self.compute_score)} returned {value!r:.200} "
                              f"({type(value).__name__}) for {where}; it must return a float (or a dict with a "
                              f"float 'score')") from e
        if not math.isfinite(score):
            if self.non_finite_score is None:
                raise RewardError(f"reward function {describe_fn(self.compute_score)} returned {score} for {where}; "
                                  f"a reward must be finite. Fix the function, or set "
                                  f"reward_model.non_finite_score=<value> to replace such scores (counted in "
                                  f"reward/non_finite_count)")
            self.non_finite_count += 1
            score = float(self.non_finite_score)
        return score

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, dict[str, list]]:
        responses = batch.tensors["responses"]
        # the response's tokens in the sequence (verl: the attention mask): with tools, their replies too, which
        # the response mask leaves out of the loss; the score goes on the last one (always the model's)
        attention = batch.tensors.get("attention_mask")
        mask = attention[:, -responses.shape[1]:] if attention is not None else batch.tensors["response_mask"]
        bsz = responses.shape[0]
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        sources = batch.non_tensors["data_source"]
        truths = batch.non_tensors["ground_truth"]
        extras = batch.non_tensors.get("extra_info")
        extra_out: dict[str, list[Any]] = {}
        self.non_finite_count = 0
        resp_cpu, mask_cpu = responses.detach().cpu(), mask.detach().cpu().bool()
        valids = [mask_cpu[i].nonzero(as_tuple=True)[0] for i in range(bsz)]
        texts = [self.tokenizer.decode(resp_cpu[i][valids[i]].tolist(), skip_special_tokens=True) for i in range(bsz)]
        extra_infos = [extras[i] if extras is not None else None for i in range(bsz)]
        if self.batched:
            results = list(self.compute_score(data_sources=list(sources), solution_strs=texts,
                                              ground_truths=list(truths), extra_infos=extra_infos))
            if len(results) != bsz:
                raise RewardError(f"reward function {describe_fn(self.compute_score)} (reward_model.reward_manager="
                                  f"batch) returned {len(results)} scores for {bsz} responses")
        else:
            results = [self.compute_score(data_source=sources[i], solution_str=texts[i], ground_truth=truths[i],
                                          extra_info=extra_infos[i]) for i in range(bsz)]
        raw = []  # each response's score as the function gave it (before the overlong penalty)
        for i, (valid, result) in enumerate(zip(valids, results)):
            score = self._to_score(result, i, sources[i])
            raw.append(score)
            if isinstance(result, dict):
                for key, value in result.items():
                    if key != "score":
                        extra_out.setdefault(key, [math.nan] * bsz)[i] = value
            if self.overlong_buffer is not None:
                penalty = self.overlong_reward(len(valid))
                score += penalty
                if self.overlong_buffer.get("log"):
                    extra_out.setdefault("overlong_reward", [math.nan] * bsz)[i] = penalty
                    extra_out.setdefault("overlong", [math.nan] * bsz)[i] = float(penalty < 0)
            if len(valid) > 0:
                scores[i, valid[-1]] = score
            else:
                logger.warning("response %d has no valid token; its score %.3f is dropped", i, score)
        if any(isinstance(result, dict) for result in results):  # verl keeps every key of the dict, score too
            extra_out["score"] = raw
        return scores.to(responses.device), extra_out


def build_reward_manager(cfg: RLXConfig, tokenizer, compute_score: Callable) -> RewardManager:
    """The manager `reward_model.reward_manager` names, configured from the typed config."""
    rm = cfg.reward_model
    kwargs = rm.reward_kwargs or {}
    return RewardManager(tokenizer, compute_score, non_finite_score=rm.non_finite_score,
                         overlong_buffer=kwargs.get("overlong_buffer_cfg") if rm.reward_manager == "dapo" else None,
                         max_resp_len=int(kwargs.get("max_resp_len") or cfg.data.max_response_length),
                         batched=rm.reward_manager == "batch")


def mean_extras(extra: dict[str, list]) -> dict[str, float]:
    """Means of the numeric extra keys (NaN entries, i.e. samples without that key, ignored)."""
    out = {}
    for key, values in extra.items():
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            continue
        if np.isfinite(arr).any():
            out[key] = float(np.nanmean(arr))
    return out
