"""The reward manager: turns generated responses into token-level scores.

Reward managers (`reward_model.reward_manager`, verl's names): `naive` scores each response and puts the score on
its last valid token; `dapo` adds DAPO's overlong penalty (`reward_kwargs.overlong_buffer_cfg`); `batch` calls the
score function once per batch with lists. The score function is rlx.reward.functions' (`load_reward_fn`).

How the calls run (naive and dapo, one call per response): with `num_workers` > 1 in a pool of processes
(rlx.reward.pool), each call bounded by `timeout_s`; with 1, or a function that does not pickle, in this process,
one after another. Either way a step whose scoring passes 30 s logs a progress line. A call that raises stops the
run, as a score that is not a finite number does: its traceback goes to the log, then a `RewardFunctionError` names
the function, the sample and its data_source (the trainer ends with it as one `rlx: training stopped:` line). A call
past the timeout gets `timeout_score`, counted in `timeouts` and said in one console line per step (the function,
the count, the limit); a step whose every call timed out (the batch manager's one call included) is a
`RewardError` naming the function, the limit and `reward_model.score_timeout_s`: all its scores would be equal.
"""
from __future__ import annotations

import logging
import math
import time
import weakref
from typing import Any, Callable, Optional

import numpy as np
import torch

from rlx.config.schema import RLXConfig
from rlx.protocol import Batch
from rlx.reward.functions import FileFunction, default_compute_score, describe_fn
from rlx.reward.pool import PROGRESS_EVERY_S, Outcome, ScorePool, call_in_process, ensure_picklable

logger = logging.getLogger(__name__)


class RewardError(ValueError):
    """A score function returned something that is not a finite number (names the function and the sample)."""


class RewardFunctionError(RewardError):
    """A score function raised on a sample (names the function, the sample and its data_source; the user's
    traceback went to the log just before)."""


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

    `num_workers`, `timeout_s`, `timeout_score`: where the calls run and how long one may take (see the module doc).
    `close()` ends the pool's processes (they also end when this process does).
    """

    def __init__(self, tokenizer, compute_score: Callable | None = None, non_finite_score: float | None = None,
                 overlong_buffer: dict | None = None, max_resp_len: int | None = None, batched: bool = False,
                 num_workers: int = 1, timeout_s: Optional[float] = None, timeout_score: float = 0.0):
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.num_workers, self.timeout_s, self.timeout_score = num_workers, timeout_s, timeout_score
        self.timeouts = 0  # calls past timeout_s in the last call of the manager
        self._pool: Optional[ScorePool] = None
        self.in_pool = False  # whether the calls run in a pool of processes (decided at the first call)
        self._decided = False
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
        assert self.max_resp_len is not None  # __init__ checks it with overlong_buffer
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
            if value is None:
                raise TypeError("None")
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

    # ---- the calls --------------------------------------------------------------------------------------
    def _decide_pool(self) -> None:
        """At the first call: a pool when num_workers > 1 and the function pickles; else this process (said once when
        the function does not pickle)."""
        self._decided = True
        if self.num_workers <= 1 or self.batched:
            return
        why = ensure_picklable(self.compute_score)
        if why is not None:
            logger.warning("rlx: note: reward function %s does not pickle (%s): it scores in this process, one call "
                           "after another, without reward_model.score_timeout_s (reward_model.num_workers=%d needs "
                           "a function defined at the top level of a file)", describe_fn(self.compute_score), why,
                           self.num_workers)
            return
        self._pool = ScorePool(self.compute_score, self.num_workers, self.timeout_s)
        self.in_pool = True
        weakref.finalize(self, self._pool.close)

    def _batch_call(self, kwargs: dict) -> Outcome:
        """The batch manager's one call: in a process of its own, bounded by timeout_s, when there is a timeout and
        the function pickles; else in this process."""
        if self.timeout_s and self._pool is None and not self._decided:
            self._decided = True
            why = ensure_picklable(self.compute_score)
            if why is None:
                self._pool = ScorePool(self.compute_score, 1, self.timeout_s)
                self.in_pool = True
                weakref.finalize(self, self._pool.close)
            else:
                logger.warning("rlx: note: reward function %s does not pickle (%s): it scores in this process, "
                               "without reward_model.score_timeout_s", describe_fn(self.compute_score), why)
        if self._pool is not None:
            return self._pool.score([kwargs])[0]
        return call_in_process(self.compute_score, kwargs)

    def _score_each(self, calls: list[dict]) -> list:
        """The function's result for each call, in order; a timed-out call's is timeout_score (counted); a call that
        raised (or whose process died) is a RewardFunctionError naming the first such sample."""
        if not self._decided:
            self._decide_pool()
        start = time.monotonic()

        def progress(done: int, elapsed: float) -> None:
            where = f"{self.num_workers} processes" if self.in_pool else "in the driver's process"
            logger.info("rlx: reward: %d/%d responses scored after %.0f s (%s, %s)", done, len(calls), elapsed,
                        describe_fn(self.compute_score), where)

        if self._pool is not None:
            outcomes = self._pool.score(calls, progress)
        else:
            outcomes, next_report = [], start + PROGRESS_EVERY_S
            for kwargs in calls:
                outcomes.append(call_in_process(self.compute_score, kwargs))
                now = time.monotonic()
                if now >= next_report and len(outcomes) < len(calls):
                    progress(len(outcomes), now - start)
                    next_report = now + PROGRESS_EVERY_S
        failed = [i for i, o in enumerate(outcomes) if o.kind in ("raised", "died")]
        if failed:
            raise self._failure(failed, outcomes, calls)
        self.timeouts = sum(o.kind == "timeout" for o in outcomes)
        if self.timeouts:
            self._report_timeouts(len(calls))
        return [float(self.timeout_score) if o.kind == "timeout" else o.value for o in outcomes]

    def _report_timeouts(self, calls: int) -> None:
        """A step with calls past timeout_s: one console line (the function, the count, the limit); when every call
        of the step timed out, a RewardError instead (every score would be timeout_score: nothing to learn)."""
        fn = describe_fn(self.compute_score)
        if self.timeouts == calls:
            raise RewardError(f"reward function {fn}: all {calls} calls of the step ran past "
                              f"reward_model.score_timeout_s={self.timeout_s} s, so every score would be "
                              f"timeout_score={self.timeout_score} and the step would learn nothing. Fix: raise "
                              f"reward_model.score_timeout_s, or make the function faster")
        logger.warning("rlx: reward: %d/%d calls of reward function %s ran past reward_model.score_timeout_s=%s s "
                       "this step; each scored timeout_score=%s", self.timeouts, calls, fn, self.timeout_s,
                       self.timeout_score)

    def _failure(self, failed: list[int], outcomes: list[Outcome], calls: list[dict]) -> RewardFunctionError:
        i = failed[0]
        first: Outcome = outcomes[i]
        fn = describe_fn(self.compute_score)
        source = calls[i]["data_source"]
        if first.traceback:
            logger.error("reward function %s raised on sample %d (data_source=%r); its traceback:\n%s", fn, i,
                         source, first.traceback.rstrip())
        more = f" ({len(failed) - 1} more samples of the batch failed too)" if len(failed) > 1 else ""
        where = f"on sample {i} (data_source={source!r}){more}"
        if first.kind == "died":
            return RewardFunctionError(f"reward function {fn} {first.error} {where}. Fix: the function must return a "
                                       f"score, not end its process")
        lines = first.error.splitlines() or [""]
        error = lines[0][:300] + (" ..." if len(lines) > 1 or len(lines[0]) > 300 else "")  # the report is one line
        return RewardFunctionError(f"reward function {fn} raised {error} {where}. Fix: correct the function (its "
                                   f"traceback is in the log above), or catch the error there and return a score")

    def close(self) -> None:
        """End the scoring processes (a later call starts new ones)."""
        if self._pool is not None:
            self._pool.close()
        self._pool, self._decided, self.in_pool = None, False, False

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
        self.non_finite_count = self.timeouts = 0
        resp_cpu, mask_cpu = responses.detach().cpu(), mask.detach().cpu().bool()
        valids = [mask_cpu[i].nonzero(as_tuple=True)[0] for i in range(bsz)]
        texts = [self.tokenizer.decode(resp_cpu[i][valids[i]].tolist(), skip_special_tokens=True) for i in range(bsz)]
        extra_infos = [extras[i] if extras is not None else None for i in range(bsz)]
        agent = batch.non_tensors.get("agent_extra")  # the agent loop's fields of a row (verl: turn_scores, ...)
        if agent is not None:
            extra_infos = [{**(e or {}), **a} if a else e for e, a in zip(extra_infos, agent)]
        if self.batched:
            outcome = self._batch_call(dict(data_sources=list(sources), solution_strs=texts,
                                            ground_truths=list(truths), extra_infos=extra_infos))
            if outcome.kind == "timeout":  # the step's one call: every call of the step timed out
                self.timeouts = 1
                raise RewardError(f"reward function {describe_fn(self.compute_score)} (reward_model.reward_manager="
                                  f"batch) ran past reward_model.score_timeout_s={self.timeout_s} s on a batch of "
                                  f"{bsz} responses, so every score would be timeout_score={self.timeout_score} and "
                                  f"the step would learn nothing. Fix: raise reward_model.score_timeout_s, or make "
                                  f"the function faster")
            if outcome.kind != "ok":
                fn = describe_fn(self.compute_score)
                logger.error("reward function %s raised on a batch of %d responses; its traceback:\n%s", fn, bsz,
                             outcome.traceback.rstrip())
                raise RewardFunctionError(f"reward function {fn} (reward_model.reward_manager=batch) raised "
                                          f"{(outcome.error.splitlines() or [''])[0][:300]} on a batch of {bsz} "
                                          f"responses (data_sources {sorted(set(map(str, sources)))}). Fix: correct "
                                          f"the function (its traceback is in the log above)")
            results = list(outcome.value)
            if len(results) != bsz:
                raise RewardError(f"reward function {describe_fn(self.compute_score)} (reward_model.reward_manager="
                                  f"batch) returned {len(results)} scores for {bsz} responses")
        else:
            results = self._score_each([dict(data_source=sources[i], solution_str=texts[i], ground_truth=truths[i],
                                             extra_info=extra_infos[i]) for i in range(bsz)])
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
                         batched=rm.reward_manager == "batch", num_workers=scoring_processes(cfg, compute_score),
                         timeout_s=rm.score_timeout_s, timeout_score=rm.timeout_score)


DEFAULT_CUSTOM_WORKERS = 8
"""reward_model.num_workers=null with a custom_reward_function: this many scoring processes."""


def scoring_processes(cfg: RLXConfig, compute_score: Callable) -> int:
    """reward_model.num_workers, or for null: DEFAULT_CUSTOM_WORKERS for a function read from a file, 1 (this
    process) for the built-in rules."""
    n = cfg.reward_model.num_workers
    if n is not None:
        return int(n)
    return DEFAULT_CUSTOM_WORKERS if isinstance(compute_score, FileFunction) else 1


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
