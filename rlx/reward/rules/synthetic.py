"""The rewards of rlx's synthetic tasks (rlx.data.synthetic, whose module doc says why each is shaped as it is)."""
from __future__ import annotations

from rlx.data.synthetic import ARITH_SOURCE, COPY_SOURCE, DEFAULT_K, DIGITS_SOURCE
from rlx.reward.rules import gsm8k

_DIGITS = "0123456789"


def digits_score(solution_str: str, ground_truth: str, extra_info: dict | None = None, **_) -> float:
    """Mean over the first k response characters of 0.5 for a digit plus 0.5 for the target digit."""
    k = int((extra_info or {}).get("k") or DEFAULT_K)
    target = str(ground_truth)
    head = solution_str[:k]
    return sum(0.5 * (c in _DIGITS) + 0.5 * (c == target) for c in head) / k


def copy_score(solution_str: str, ground_truth: str, extra_info: dict | None = None, **_) -> float:
    """Mean over the target's positions of 1.0 for the right digit, 0.25 for a wrong digit, 0 otherwise."""
    target = str(ground_truth)
    if not target:
        return 0.0
    head = solution_str[:len(target)]
    return sum(1.0 if c == t else (0.25 if c in _DIGITS else 0.0) for c, t in zip(head, target)) / len(target)


def arith_score(solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs) -> float:
    """GSM8K's rule (strict: the number after ``#### ``), as verl scores GSM8K."""
    return gsm8k.compute_score(solution_str, str(ground_truth), **kwargs)


REWARDS = {DIGITS_SOURCE: digits_score, COPY_SOURCE: copy_score, ARITH_SOURCE: arith_score}
"""The score function of each synthetic data_source."""
