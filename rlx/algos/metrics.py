"""Training metrics computed from a batch of tensors (pure functions, verl-compatible metric names)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence, Union

import numpy as np
import torch

__all__ = [
    "compute_data_metrics",
    "compute_timing_metrics",
    "compute_throughput_metrics",
    "reduce_metrics",
]


def _to_float(v: Any) -> float:
    if isinstance(v, torch.Tensor):
        return float(v.detach().float().mean().item()) if v.numel() != 1 else float(v.detach().item())
    if isinstance(v, np.ndarray):
        return float(v.mean()) if v.size != 1 else float(v.item())
    return float(v)


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    """``{prefix}/mean|max|min`` of a 1-D tensor; NaN for an empty one (e.g. no valid token)."""
    x = x.detach().float().reshape(-1)
    if x.numel() == 0:
        nan = float("nan")
        return {f"{prefix}/mean": nan, f"{prefix}/max": nan, f"{prefix}/min": nan}
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def _length_stats(prefix: str, lengths: torch.Tensor, max_length: int) -> dict[str, float]:
    out = _stats(prefix, lengths)
    clip = (lengths == max_length).float().mean().item() if lengths.numel() else float("nan")
    out[f"{prefix}/clip_ratio"] = clip
    return out


def compute_data_metrics(batch_tensors: Mapping[str, torch.Tensor], use_critic: bool = True) -> dict[str, float]:
    """Scalar statistics of one training batch.

    ``batch_tensors`` may hold (``R`` = max response length, ``P`` = max prompt length):
    ``token_level_scores`` / ``token_level_rewards`` / ``advantages`` / ``returns`` / ``values``
    ``[B, R]``, ``responses`` ``[B, R]``, ``response_mask`` ``[B, R]``, ``attention_mask``
    ``[B, P + R]``, ``prompts`` ``[B, P]``. Metrics are produced for the entries present:

    * ``critic/score/{mean,max,min}``: per-sequence sums of ``token_level_scores``;
    * ``critic/rewards/{mean,max,min}``: per-sequence sums of ``token_level_rewards``;
    * ``critic/advantages/*``, ``critic/returns/*``: over valid response tokens;
    * ``critic/values/*`` and ``critic/vf_explained_var`` (``1 - Var(R - V) / (Var(R) + 1e-5)``, over
      valid tokens) when ``use_critic``;
    * ``response_length/{mean,max,min,clip_ratio}``: lengths from the response half of
      ``attention_mask`` (or ``response_mask`` when there is no attention mask); ``clip_ratio`` is the
      fraction of responses whose length equals ``R``;
    * ``prompt_length/{mean,max,min,clip_ratio}``: from the prompt half of ``attention_mask``;
      ``clip_ratio`` is the fraction of prompts filling all ``P`` positions.

    ``R`` is taken from the tensors' shapes (``responses``, else ``response_mask``), never from config.
    """
    bt = batch_tensors
    metrics: dict[str, float] = {}

    if "responses" in bt:
        max_response_length = int(bt["responses"].shape[-1])
    elif "response_mask" in bt:
        max_response_length = int(bt["response_mask"].shape[-1])
    else:
        max_response_length = None

    attention_mask = bt.get("attention_mask")
    if "response_mask" in bt:
        response_mask = bt["response_mask"].bool()
    elif attention_mask is not None and max_response_length is not None:
        response_mask = attention_mask[:, -max_response_length:].bool()
    else:
        response_mask = None

    if "token_level_scores" in bt:
        metrics.update(_stats("critic/score", bt["token_level_scores"].sum(-1)))
    if "token_level_rewards" in bt:
        metrics.update(_stats("critic/rewards", bt["token_level_rewards"].sum(-1)))

    def _valid(name: str) -> torch.Tensor:
        t = bt[name]
        if response_mask is None:
            return t.reshape(-1)
        return torch.masked_select(t, response_mask)

    if "advantages" in bt:
        metrics.update(_stats("critic/advantages", _valid("advantages")))
    if "returns" in bt:
        metrics.update(_stats("critic/returns", _valid("returns")))

    if use_critic:
        if "values" not in bt:
            raise KeyError("compute_data_metrics(use_critic=True) needs 'values' in the batch")
        valid_values = _valid("values").float()
        metrics.update(_stats("critic/values", valid_values))
        if "returns" in bt:
            valid_returns = _valid("returns").float()
            if valid_returns.numel() > 1:
                return_diff_var = torch.var(valid_returns - valid_values)
                return_var = torch.var(valid_returns)
                metrics["critic/vf_explained_var"] = (1.0 - return_diff_var / (return_var + 1e-5)).item()
            else:
                metrics["critic/vf_explained_var"] = float("nan")

    if max_response_length is not None:
        if attention_mask is not None:
            resp_len = attention_mask[:, -max_response_length:].float().sum(-1)
        elif response_mask is not None:
            resp_len = response_mask.float().sum(-1)
        else:
            resp_len = None
        if resp_len is not None:
            metrics.update(_length_stats("response_length", resp_len, max_response_length))

        if attention_mask is not None:
            prompt_mask = attention_mask[:, :-max_response_length]
            max_prompt_length = int(prompt_mask.shape[-1])
            metrics.update(_length_stats("prompt_length", prompt_mask.float().sum(-1), max_prompt_length))

    return metrics


def compute_timing_metrics(timing: Mapping[str, float]) -> dict[str, float]:
    """``{name: seconds}`` -> ``{"timing_s/<name>": seconds}``."""
    return {f"timing_s/{name}": _to_float(value) for name, value in timing.items()}


def compute_throughput_metrics(batch_tokens: int, step_time: float, n_gpus: int) -> dict[str, float]:
    """Tokens processed in a step, the step's wall time, and tokens / second / GPU.

    ``perf/throughput`` is NaN when ``step_time`` or ``n_gpus`` is not positive.
    """
    denom = float(step_time) * int(n_gpus)
    return {
        "perf/total_num_tokens": int(batch_tokens),
        "perf/time_per_step": float(step_time),
        "perf/throughput": float(batch_tokens) / denom if denom > 0 else float("nan"),
    }


def reduce_metrics(
    metrics: Union[Mapping[str, Any], Sequence[Mapping[str, Any]]],
) -> dict[str, float]:
    """Mean-reduce metrics given either as ``{name: [v, ...]}`` or as ``[{name: v}, ...]``.

    Values may be Python numbers, numpy values or tensors (a multi-element tensor contributes its
    mean). In the list-of-dicts form each key is averaged over the dicts that contain it. A key with no
    values is dropped.
    """
    if isinstance(metrics, Mapping):
        grouped: Mapping[str, Any] = metrics
    else:
        acc: dict[str, list] = defaultdict(list)
        for d in metrics:
            for k, v in d.items():
                acc[k].append(v)
        grouped = acc

    out: dict[str, float] = {}
    for k, vals in grouped.items():
        if isinstance(vals, (list, tuple)):
            if len(vals) == 0:
                continue
            out[k] = float(np.mean([_to_float(v) for v in vals]))
        else:
            out[k] = _to_float(vals)
    return out
