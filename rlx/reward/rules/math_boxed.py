"""The MATH benchmark's answer check (Hendrycks et al., "Measuring Mathematical Problem Solving With the MATH
Dataset", NeurIPS 2021), as verl scores `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval` and
`HuggingFaceH4/MATH-500`.

The answer is the content of the last ``\\boxed{...}`` (or ``\\boxed x`` up to the next ``$``); it is right when
it equals the ground truth after both are put through the benchmark's string normalisation (`normalise`): 1.0,
else 0.0. A response whose box cannot be read (unbalanced braces, an ``\\fbox``) scores 0.0. When normalising
fails on a malformed string, the raw strings are compared.
"""
from __future__ import annotations


class Unreadable(ValueError, AssertionError):
    """A string the normalisation cannot read (the benchmark then compares the raw strings). Also an AssertionError,
    which verl's `remove_boxed` raises for such a string: code written against verl catches it the same way."""


def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` (braces balanced) of `text` with its command, ``\\boxed <x>`` (up to a ``$``)
    when the text uses that form, the last ``\\fbox{...}`` when there is no ``\\boxed``; None when there is none."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    return balanced_from(text, start)


def balanced_from(text: str, start: int) -> str | None:
    """`text` from `start` through the brace that closes the first one opened there, or None if none closes."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    return None


def unbox(boxed: str) -> str:
    """The content of ``\\boxed <x>`` or ``\\boxed{x}``; `Unreadable` for anything else (e.g. ``\\fbox{x}``)."""
    if "\\boxed " in boxed:
        if not boxed.startswith("\\boxed "):
            raise Unreadable(boxed)
        return boxed[len("\\boxed "):]
    if not boxed.startswith("\\boxed{") or not boxed.endswith("}"):
        raise Unreadable(boxed)
    return boxed[len("\\boxed{"):-1]


def _drop_right_units(s: str) -> str:
    parts = s.split("\\text{ ")  # "\text{ " only introduces units in MATH
    if len(parts) == 1:
        return s
    if len(parts) != 2:
        raise Unreadable(s)
    return parts[0]


def _brace_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``."""
    parts = s.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        if not part:
            raise Unreadable(s)
        out += "\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:]
    return out


def _brace_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; a ``\\frac`` followed by fewer than
    two characters leaves the whole string as it was."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if not part:
            raise Unreadable(s)
        if part[0] == "{":
            out += part
            continue
        if len(part) < 2:
            return s
        num, nxt, rest = part[0], part[1], part[2:]
        out += "{" + num + "}" + (nxt if nxt == "{" else "{" + nxt + "}") + rest
    return out


def _slash_to_frac(s: str) -> str:
    """``3/4`` (two plain integers) -> ``\\frac{3}{4}``."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        num, den = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    if s != f"{num}/{den}":
        return s
    return "\\frac{" + str(num) + "}{" + str(den) + "}"


def normalise(s: str) -> str:
    """The MATH benchmark's normal form of an answer string (raises `Unreadable`/IndexError on malformed ones)."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")  # degrees
    s = s.replace("\\$", "")
    s = _drop_right_units(s)
    s = s.replace("\\\\%", "").replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 3" -> "3"
        s = sides[1]
    s = _brace_sqrt(s)
    s = s.replace(" ", "")
    s = _brace_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def is_equiv(answer: str | None, truth: str | None) -> bool:
    if answer is None or truth is None:
        return answer is None and truth is None
    try:
        return normalise(answer) == normalise(truth)
    except Exception:  # noqa: BLE001 - the benchmark's rule: a malformed string is compared as written
        return answer == truth


def compute_score(solution_str: str, ground_truth) -> float:
    """1.0 when the last boxed answer of `solution_str` is equivalent to `ground_truth`, else 0.0."""
    boxed = last_boxed(solution_str)
    if boxed is None:
        return 0.0
    try:
        answer = unbox(boxed)
        return 1.0 if is_equiv(answer, ground_truth) else 0.0
    except Exception:  # noqa: BLE001 - an unreadable box scores 0
        return 0.0
