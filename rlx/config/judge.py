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


def check_judge(cfg, errors):
    """reward_model.judge.*: a generative reward model needs the reward model on, a template with the fields it
    fills, a score range, and an engine that can serve it."""
    from rlx.config.judge import REQUIRED_FIELDS, TEMPLATE_FIELDS, template_fields

    rm, j = cfg.reward_model, cfg.reward_model.judge
    if not j.enable:
        return
    if not rm.enable:
        errors.append("reward_model.judge.enable=True needs reward_model.enable=True (the judge is the reward "
                      "model). Fix: add reward_model.enable=True, or drop reward_model.judge.enable.")
    if j.prompt_template is not None:
        try:
            fields = template_fields(j.prompt_template)
        except ValueError as e:
            fields = None
            errors.append(f"reward_model.judge.prompt_template cannot be read as a str.format template ({e}). Fix: "
                          f"write a literal brace twice ({{{{ or }}}}).")
        if fields is not None:
            unknown = sorted({f for f in fields if f not in TEMPLATE_FIELDS})
            missing = [f for f in REQUIRED_FIELDS if f not in fields]
            if unknown:
                errors.append(f"reward_model.judge.prompt_template names {unknown}, which rlx does not fill. Fix: use "
                              f"only {list(TEMPLATE_FIELDS)} (a literal brace is written twice).")
            if missing:
                errors.append(f"reward_model.judge.prompt_template has no {missing} field(s): the judge would not see "
                              f"{' and '.join(missing)}. Fix: add " + " and ".join("{" + f + "}" for f in missing)
                              + ".")
    if rm.model.override_config:
        errors.append(f"reward_model.model.override_config={dict(rm.model.override_config)!r} is applied to a "
                      f"classifier only; the judge is loaded as its checkpoint stands. Fix: drop it (or bake the "
                      f"change into the judge's config.json).")
    if not j.min_score < j.max_score:
        errors.append(f"reward_model.judge.min_score={j.min_score} must be below reward_model.judge.max_score="
                      f"{j.max_score}. Fix: give the score range the template asks for.")
    if j.do_sample and j.temperature <= 0:
        errors.append(f"reward_model.judge.temperature={j.temperature} must be positive with "
                      f"reward_model.judge.do_sample=True. Fix: a positive temperature, or do_sample=False (greedy).")
    if not 0 < j.top_p <= 1:
        errors.append(f"reward_model.judge.top_p={j.top_p} must be in (0, 1]. Fix: reward_model.judge.top_p=1.0.")
    r = rm.rollout
    for key in ("prompt_length", "response_length"):
        if getattr(r, key) is not None and getattr(r, key) <= 0:
            errors.append(f"reward_model.rollout.{key}={getattr(r, key)} must be positive (or null: 2048).")
    # the judge's engine without vLLM installed: rlx.trainer.probes
    if r.load_format is not None and str(r.load_format).startswith("dummy"):
        errors.append(f"reward_model.rollout.load_format={r.load_format!r} gives the judge random weights (nothing "
                      f"is synced into it). Fix: reward_model.rollout.load_format=auto (or leave it out).")
    tp, gpus = r.tensor_model_parallel_size or 1, cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    if tp < 1 or gpus % tp:
        errors.append(f"reward_model.rollout.tensor_model_parallel_size={tp} must divide the reward model's GPUs "
                      f"(trainer.n_gpus_per_node * trainer.nnodes = {gpus}). Fix: a divisor of {gpus}.")
    elif tp > 1 and cfg.trainer.device == "cpu":
        errors.append(f"reward_model.rollout.tensor_model_parallel_size={tp} needs GPUs; on CPU every rank runs its "
                      f"own judge. Fix: reward_model.rollout.tensor_model_parallel_size=1.")
    need = (r.prompt_length or 2048) + (r.response_length or 2048)
    if r.max_model_len is not None and r.max_model_len < need:
        errors.append(f"reward_model.rollout.max_model_len={r.max_model_len} is smaller than the judge's "
                      f"reward_model.rollout.prompt_length + response_length = {need}. Fix: raise it, or shorten them.")
