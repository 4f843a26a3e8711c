"""Which math scorer verl uses for which `data_source` (verl 0.9.1's default_compute_score)."""
from __future__ import annotations

from typing import Callable

from rlx.reward.rules import math_boxed, math_minerva

MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
DAPO_PREFIX = "aime"  # aime2024, aime2025, ...: Minerva's check too
SOURCES = (*MATH_SOURCES, *DAPO_SOURCES)


def scorer(data_source) -> Callable | None:
    """The score function of a math `data_source`, or None when it is not one."""
    if data_source in MATH_SOURCES:
        return math_boxed.compute_score
    if data_source in DAPO_SOURCES or (isinstance(data_source, str) and data_source.startswith(DAPO_PREFIX)):
        return math_minerva.compute_score
    return None
