"""The math scorers verl uses by data_source: MATH (last boxed answer, the benchmark's normalisation, 1/0) and
DAPO-Math / AIME (Minerva's `Answer:` line, else the boxed answer as written, +1/-1). Expected values by hand."""
from __future__ import annotations

import pytest

from rlx.reward.functions import default_compute_score, is_builtin_source
from rlx.reward.rules import math_boxed, math_minerva


@pytest.mark.parametrize("solution,truth,expected", [
    ("so the answer is \\boxed{4}.", "4", 1.0),
    ("\\boxed{3} then \\boxed{4}", "4", 1.0),  # the last box
    ("\\boxed{4} then \\boxed{3}", "4", 0.0),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),  # dfrac -> frac, \frac12 -> \frac{1}{2}
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),  # 0.5 is written \frac{1}{2}
    ("\\boxed{1/2}", "\\frac{1}{2}", 1.0),  # a/b of integers -> \frac{a}{b}
    ("\\boxed{x = 3}", "3", 1.0),  # a short left-hand side is dropped
    ("\\boxed{10\\%}", "10", 1.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),  # units after "\text{ " dropped
    ("\\boxed{\\sqrt2}", "\\sqrt{2}", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{.5}", "0.5", 1.0),  # ".5" -> "0.5" -> \frac{1}{2}, both sides
    ("\\boxed{1,000}", "1000", 0.0),  # commas are kept
    ("$\\boxed 7$ done", "7", 1.0),  # "\boxed 7" up to the next "$"
    ("\\fbox{7}", "7", 0.0),  # found, but not a \boxed{}: unreadable, 0
    ("\\boxed{4", "4", 0.0),  # unbalanced
    ("the answer is 4", "4", 0.0),
])
def test_math_boxed(solution, truth, expected):
    assert math_boxed.compute_score(solution, truth) == expected
    assert default_compute_score("lighteval/MATH", solution, truth) == expected
    assert default_compute_score("HuggingFaceH4/MATH-500", solution, truth) == expected


def test_math_boxed_normalise_steps():
    assert math_boxed.normalise("\\left( 3, \\frac12 \\right)") == "(3,\\frac{1}{2})"
    assert math_boxed.normalise("k = 7") == "7"
    assert math_boxed.normalise("long = 7") == "long=7"  # left-hand side longer than 2 characters: kept
    # two "\text{ " units: unreadable -> the raw strings are compared
    assert math_boxed.is_equiv("1 \\text{ m} 2 \\text{ s}", "1 \\text{ m} 2 \\text{ s}")
    assert not math_boxed.is_equiv("1 \\text{ m} 2 \\text{ s}", "1")
    assert math_boxed.is_equiv(None, None) and not math_boxed.is_equiv("1", None)


@pytest.mark.parametrize("solution,truth,score,pred", [
    ("work...\nAnswer: 42", "42", 1.0, "42"),
    ("answer : $42$ dollars", "42", 1.0, "42"),  # any case; $..$ kept, "dollars" removed
    ("Answer: x = 1,000", "1000", 1.0, "1000"),  # after the last "=", digits with commas -> without
    ("Answer: \\frac12", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),
    ("Answer: 5 units", "5", 1.0, "5"),
    ("Answer: 41\nAnswer: 42", "42", 1.0, "42"),  # the last Answer: line
    ("Answer: 41", "42", -1.0, "41"),
    ("no answer line but \\boxed{42}", "42", 1.0, "42"),  # the boxed fallback, compared as written
    ("\\boxed{ 42}", "42", -1.0, " 42"),  # as written: no normalisation in the fallback
    ("nothing at all", "42", -1.0, "[INVALID]"),
    ("\\boxed{42}" + "x" * 100, "42", -1.0, "[INVALID]"),  # the box is beyond the last 100 characters
])
def test_math_minerva(solution, truth, score, pred):
    out = math_minerva.compute_score(solution, truth)
    assert out == {"score": score, "acc": score == 1.0, "pred": pred}
    for source in ("math_dapo", "math", "math_dapo_reasoning", "aime2024"):
        assert default_compute_score(source, solution, truth) == out


def test_math_minerva_clip_and_strict_box():
    # only the last 300 characters are read: an Answer: line before them is not seen
    assert math_minerva.compute_score("Answer: 42\n" + "y" * 300, "42")["score"] == -1.0
    # strict_box_verify: the box only, even with an Answer: line
    out = math_minerva.compute_score("Answer: 41 \\boxed{42}", "42", strict_box_verify=True)
    assert out == {"score": 1.0, "acc": True, "pred": "42"}
    assert math_minerva.compute_score("Answer: 42", "42", strict_box_verify=True)["pred"] is None


def test_math_sources_are_builtin():
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "math_dapo", "aime2025", "openai/gsm8k"):
        assert is_builtin_source(source)
    assert not is_builtin_source("some/other")
