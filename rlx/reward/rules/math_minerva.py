"""Minerva's answer check (Lewkowycz et al., "Solving Quantitative Reasoning Problems with Language Models",
NeurIPS 2022, appendix D.1), as verl scores DAPO-Math (`math_dapo`, `math`, `math_dapo_reasoning`, `aime*`).

Only the last 300 characters of a response are read. The answer is the text after the last ``Answer:`` (any case)
up to the end of its line, normalised (`normalise`) and compared with the normalised ground truth. Without an
``Answer:`` line, the last ``\\boxed{...}`` of the final 100 characters is compared, as written, with the ground
truth as written. The score is +1.0 when right and -1.0 otherwise (DAPO's reward), returned as
``{"score", "acc", "pred"}``. `strict_box_verify=True` uses the boxed answer only.
"""
from __future__ import annotations

import re

from rlx.reward.rules.math_boxed import Unreadable, balanced_from

CLIP_CHARS = 300
BOX_CHARS = 100
INVALID = "[INVALID]"
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva's normalisation tables: replacements in order, then removals in order
_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
            (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_REMOVE = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
           "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
           "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
           "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
           r",\!", "{,}", '"', "\\dots")
# (pattern, replacement) in order: keep what is inside $...$, \text{}, \textbf{}, \overline{}, \boxed{}; then
# \fracab -> \frac{a}{b} and \sqrta -> \sqrt{a}
_UNWRAP = ((r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"), (r"(\\text\{)(.*?)(\})", "\\2"), (r"(\\textbf\{)(.*?)(\})", "\\2"),
           (r"(\\overline\{)(.*?)(\})", "\\2"), (r"(\\boxed\{)(.*)(\})", "\\2"),
           (r"(frac)([^{])(.)", "frac{\\2}{\\3}"), (r"(sqrt)([^{])", "sqrt{\\2}"))


def normalise(answer: str) -> str:
    """Minerva's normal form of a final answer: the part after the last ``=``, units and TeX wrappers removed,
    ``1,000`` -> ``1000``."""
    answer = answer.split("=")[-1]
    for before, after in _REPLACE:
        answer = answer.replace(before, after)
    for expr in _REMOVE:
        answer = answer.replace(expr, "")
    for pattern, repl in _UNWRAP:
        answer = re.sub(pattern, repl, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` of `text` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    return balanced_from(text, start)


def unbox(boxed: str) -> str:
    """The content of ``\\boxed{x}``; `Unreadable` (a ValueError and an AssertionError) for anything else."""
    if not boxed.startswith("\\boxed{") or not boxed.endswith("}"):
        raise Unreadable(f"box error: {boxed}")
    return boxed[len("\\boxed{"):-1]


def boxed_answer(text: str, pause_tokens_index: list[int] | None = None) -> str | None:
    """The content of the last ``\\boxed{...}`` in the final 100 characters (before the last pause token, when
    given), or None."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index={pause_tokens_index!r} must hold 4 indices")
        text = text[pause_tokens_index[-1] - BOX_CHARS:]
    else:
        text = text[-BOX_CHARS:]
    boxed = last_boxed(text)
    return None if boxed is None else unbox(boxed)


def verify(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
           pause_tokens_index: list[int] | None = None) -> tuple[bool, str | None]:
    """(right?, the answer read) for one response."""
    if strict_box_verify:
        pred = boxed_answer(solution_str, pause_tokens_index)
        return pred == ground_truth, pred
    found = _ANSWER.findall(solution_str)
    pred = normalise(found[-1] if found else INVALID)
    right = pred == normalise(ground_truth)
    if pred != INVALID:
        return right, pred
    boxed = boxed_answer(solution_str, pause_tokens_index)
    if boxed is not None:
        return boxed == ground_truth, boxed
    return right, pred


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
                  pause_tokens_index: list[int] | None = None) -> dict:
    """``{"score": 1.0 or -1.0, "acc": right?, "pred": the answer read}``."""
    right, pred = verify(solution_str[-CLIP_CHARS:], ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}
