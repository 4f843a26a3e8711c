"""GSM8K reward, as verl scores it (ReFT's rule: Trung et al., "ReFT: Reasoning with Reinforced Fine-Tuning", ACL 2024).

Only the last `CLIP_CHARS` characters of a response are read. The answer is a string of digits, dots and commas:
- strict: the last one written right after ``"#### "`` (one space, an optional minus sign), its commas removed;
- flexible: the last one anywhere in the tail that is not a lone ``"."``, taken as written (commas kept).
The answer is compared with the ground truth as a string, so ``18.``, ``18.00``, ``018`` and ``$18`` are not
``18``, and ``####18`` or ``####  18`` are no answer at all. The score is ``score`` for an equal answer,
``format_score`` for another answer, 0 for no answer.
"""
from __future__ import annotations

import re

CLIP_CHARS = 300
"""verl reads the last 300 characters of a response (its stand-in for the last 300 tokens)."""

METHODS = ("strict", "flexible")
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9.,]+")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string that `method` reads in the tail of `solution_str`, or None when there is none."""
    if method not in METHODS:
        raise ValueError(f"gsm8k method={method!r}; use one of {list(METHODS)}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "") if found else None
    found = _NUMBER.findall(tail)
    if not found:
        return None
    for candidate in reversed(found):
        if candidate != ".":
            return candidate
    return found[0]  # every candidate is a lone "." (verl keeps the last one its loop looked at)


def compute_score(solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    """``score`` when the extracted answer equals `ground_truth` (string equality), ``format_score`` for any
    other answer, 0.0 when there is none."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answer == ground_truth else float(format_score)
