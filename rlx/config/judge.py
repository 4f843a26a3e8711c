"""The generative reward model's own keys (`reward_model.judge.*`, rlx keys: verl leaves the judge's prompt, its
sampling and the reading of its verdict to a custom reward function that calls the judge's server) and the built-in
prompt templates.

A template is plain text with `str.format` fields: {question}, {response}, and optionally {ground_truth},
{min_score}, {max_score}; a literal brace is written twice ({{ or }}).
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Optional

TEMPLATE_FIELDS = ("question", "response", "ground_truth", "min_score", "max_score")
REQUIRED_FIELDS = ("question", "response")

TEMPLATE = """You are grading an answer written by a student.

Question:
{question}

Student's answer:
{response}

How correct and well reasoned is the student's answer? Think briefly, then finish your reply with one line of the \
form "Score: N", where N is a whole number from {min_score} (wrong or irrelevant) to {max_score} (fully correct and \
well reasoned)."""
"""The built-in template for rows without a ground truth."""

TEMPLATE_WITH_REFERENCE = """You are grading an answer written by a student.

Question:
{question}

Reference answer (known to be correct):
{ground_truth}

Student's answer:
{response}

Does the student's answer reach the same final result as the reference answer, with sound reasoning? Think briefly, \
then finish your reply with one line of the form "Score: N", where N is a whole number from {min_score} (wrong) to \
{max_score} (correct and well reasoned)."""
"""The built-in template for rows that carry a ground truth (the dataset's reward_model.ground_truth)."""


@dataclass
class RewardJudgeConfig:
    enable: bool = False
    """rlx key: the reward model (reward_model.model.path, a causal LM) is a generative judge: it reads a prompt
    built from prompt_template, writes a verdict, and the number parsed from the verdict is the reward (on the
    response's last valid token, as a discriminative reward model's score). Needs reward_model.enable=True. With
    custom_reward_function.path, that function scores instead and finds the judge's judge_score and judge_verdict in
    each row's extra_info (to combine them with a rule). verl has no such key: there a judge is a
    reward_model.model.path plus a custom reward function that calls it."""
    prompt_template: Optional[str] = None
    """The judge's user message, a str.format template with {question} and {response} (required) and optionally
    {ground_truth}, {min_score}, {max_score}; it is written with the judge's chat template (generation prompt on).
    null: rlx's built-in one (rlx.config.judge.TEMPLATE_WITH_REFERENCE for rows with a ground truth, TEMPLATE
    otherwise), which asks for a last line "Score: N". {question} is the row's extra_info.question when the
    dataset has it (verl's GSM8K files do), else the content of the prompt's last user message, else the prompt
    text; {ground_truth} is empty for a row without one."""
    min_score: float = 0.0
    """The lowest score the judge may give (also {min_score} in the template). A parsed score below it is a parse
    failure."""
    max_score: float = 10.0
    """The highest score the judge may give (also {max_score} in the template). A parsed score above it is a parse
    failure."""
    failure_score: float = 0.0
    """The reward of a response whose verdict has no usable score (no number, or one outside [min_score,
    max_score]); each such response is counted in reward/judge_parse_failures."""
    do_sample: bool = False
    """Sample the verdict (temperature, top_p, top_k) instead of decoding it greedily."""
    temperature: float = 1.0
    """The judge's sampling temperature (with do_sample=True)."""
    top_p: float = 1.0
    """The judge's nucleus sampling (with do_sample=True)."""
    top_k: int = -1
    """The judge's top-k sampling (with do_sample=True; -1: off)."""


def template_fields(template: str) -> list[str]:
    """The field names a template uses (ValueError for a template str.format cannot read)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
