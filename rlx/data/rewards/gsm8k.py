"""GSM8K reward. verl's "strict" method: the answer is the number after the LAST ``####`` in the response;
"flexible" (verl's GSM8K tool): the last number anywhere in it."""
from __future__ import annotations

import re

_ANSWER = re.compile(r"####\s*\$?\s*(-?[0-9.,]*[0-9][0-9.,]*)")
_CLIP_CHARS = 1000  # only the tail matters, and regexes over huge garbage responses get slow


def _normalise(number: str) -> str:
    number = number.replace(",", "").replace("$", "").strip().rstrip(".")
    if "." in number:  # "18.00" == "18"
        number = number.rstrip("0").rstrip(".")
    return number


def extract_solution(solution_str: str) -> str | None:
    """The normalised number after the last ``####`` (commas, ``$`` and a trailing period stripped), or None."""
    found = _ANSWER.findall(solution_str[-_CLIP_CHARS:])
    return _normalise(found[-1]) if found else None


_NUMBER = re.compile(r"-?[0-9.,]+")


def extract_flexible(solution_str: str) -> str | None:
    """The normalised last number of the text (a lone "." is not a number), or None."""
    for found in reversed(_NUMBER.findall(solution_str[-_CLIP_CHARS:])):
        if found not in ("", ".") and any(c.isdigit() for c in found):
            return _normalise(found)
    return None


def compute_score(solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0, **_) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong ``#### <number>`` answer, else 0."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k compute_score: method must be 'strict' or 'flexible' (got {method!r})")
    answer = extract_solution(solution_str) if method == "strict" else extract_flexible(solution_str)
    if answer is None:
        return 0.0
    truth = _normalise(str(ground_truth))
    if answer == truth:
        return float(score)
    try:
        if float(answer) == float(truth):
            return float(score)
    except ValueError:
        pass
    return float(format_score)
