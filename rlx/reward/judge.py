"""What a generative judge reads and how its verdict becomes a score (the judge's engine runs in the reward-model
worker: rlx.workers.judge).

`judge_prompts` fills the judge's template (rlx.config.judge) with each row's question, response and ground truth
and writes it with the judge's chat template; `parse_score` reads each verdict, `read_verdicts` turns a batch of
them into scores and counts, and `judge_metrics` sums the counts over the whole batch:

1. When the verdict has a reasoning part closed by ``</think>``, only the text after the last one is read.
2. A number that follows the word score, rating or grade (any case, on the same line, at most 20 characters of
   other text between, e.g. "Score: 7", "final rating = 8.5", "score of 6") is the score; of several, the last.
3. Otherwise the last number of the text is the score, leaving out denominators: a number right after "/" or
   "out of" ("7/10" and "7 out of 10" read 7).
4. No number, or one outside [min_score, max_score]: no score (None); the caller gives the failure score and
   counts it.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np
import torch

from rlx.config.judge import TEMPLATE, TEMPLATE_WITH_REFERENCE, RewardJudgeConfig
from rlx.protocol import Batch

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_KEYWORD = re.compile(r"\b(?:score|rating|grade)\b[^\n\d+-]{0,20}?(" + _NUMBER + r")", re.IGNORECASE)
_ANY = re.compile(r"(?<![\d.])" + _NUMBER)
_DENOMINATOR = re.compile(r"(?:/|\bout\s+of)\s*$", re.IGNORECASE)


def parse_score(verdict: str, min_score: float, max_score: float) -> Optional[float]:
    """The score a judge's verdict gives (see the module doc), or None when it gives none."""
    text = verdict.rsplit("</think>", 1)[-1]
    keyed = _KEYWORD.findall(text)
    if keyed:
        value = float(keyed[-1])
    else:
        numbers = [m.group(0) for m in _ANY.finditer(text) if not _DENOMINATOR.search(text[max(0, m.start() - 12):m.start()])]
        if not numbers:
            return None
        value = float(numbers[-1])
    return value if min_score <= value <= max_score else None


def question_of(raw_chat, raw_prompt, extra_info) -> str:
    """The question a row asks: extra_info["question"] when there is one, else the content of the prompt's last
    user message, else the prompt text."""
    if isinstance(extra_info, dict) and extra_info.get("question"):
        return str(extra_info["question"])
    if isinstance(raw_chat, (list, tuple)):
        users = [m for m in raw_chat if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return str(users[-1].get("content", ""))
    return str(raw_prompt if raw_prompt is not None else raw_chat)


def fill_template(judge: RewardJudgeConfig, question: str, response: str, ground_truth) -> str:
    """The judge's user message for one row."""
    has_truth = ground_truth is not None and str(ground_truth) != ""
    template = judge.prompt_template or (TEMPLATE_WITH_REFERENCE if has_truth else TEMPLATE)
    return template.format(question=question, response=response, ground_truth=str(ground_truth) if has_truth else "",
                           min_score=_num(judge.min_score), max_score=_num(judge.max_score))


def render_chat(tokenizer, message: str) -> list[int]:
    """Token ids of `message` as the user's turn in the judge's chat template, generation prompt on (the bare text
    when the tokenizer has no chat template)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                             tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(message, add_special_tokens=True)["input_ids"]


def _num(x: float):
    return int(x) if float(x).is_integer() else x


def with_judge_results(batch: Batch, judged: Batch) -> Batch:
    """`batch` whose rows' extra_info also hold the judge's `judge_score` (the parsed score, or the failure score:
    the value the judge alone would give) and `judge_verdict` (its text), for a custom reward function that combines
    them with a rule (the row's own extra_info dicts are not changed)."""
    scores = judged["judge_score"].tolist()
    extras = batch.non_tensors.get("extra_info")
    rows = []
    for i in range(len(batch)):
        info = dict(extras[i]) if extras is not None and isinstance(extras[i], dict) else {}
        info.update(judge_score=float(scores[i]), judge_verdict=str(judged["judge_verdict"][i]))
        rows.append(info)
    out = np.empty(len(rows), dtype=object)
    out[:] = rows
    return Batch(dict(batch.tensors), {**batch.non_tensors, "extra_info": out}, dict(batch.meta))


def judge_prompts(batch: Batch, actor_tokenizer, judge_tokenizer, judge: RewardJudgeConfig,
                  prompt_length: int) -> tuple[list[list[int]], list[float]]:
    """Each row's judging prompt as the judge's token ids (a longer one keeps its last `prompt_length` tokens), and
    1.0 for each one so cut. The response is decoded with the actor's tokenizer (special tokens skipped)."""
    responses = batch["responses"]
    attention = batch.tensors.get("attention_mask")
    mask = attention[:, -responses.shape[1]:] if attention is not None else batch["response_mask"]
    chats, raw, extras = (batch.non_tensors.get(k) for k in ("raw_chat", "raw_prompt", "extra_info"))
    truths = batch.non_tensors.get("ground_truth")
    out, cut = [], []
    for i in range(len(batch)):
        response = actor_tokenizer.decode(responses[i][mask[i].bool()].tolist(), skip_special_tokens=True)
        question = question_of(chats[i] if chats is not None else None, raw[i] if raw is not None else None,
                               extras[i] if extras is not None else None)
        message = fill_template(judge, question, response, truths[i] if truths is not None else None)
        ids = render_chat(judge_tokenizer, message)
        cut.append(float(len(ids) > prompt_length))
        out.append(ids[-prompt_length:])
    return out, cut


def read_verdicts(texts: list[str], verdict_ids: list[list[int]], judge: RewardJudgeConfig, eos_ids,
                  response_length: int, cut: list[float]) -> Batch:
    """Per row: `judge_score` (the parsed score, or judge.failure_score), `judge_failed` (1 when the verdict gave no
    usable score), `judge_clipped` (1 when the verdict hit `response_length` without an end token), `judge_tokens`
    (the verdict's length), `judge_prompt_cut` (`cut`, from judge_prompts) and `judge_verdict` (its text)."""
    eos = set(eos_ids)
    parsed = [parse_score(t, judge.min_score, judge.max_score) for t in texts]
    scores = torch.tensor([judge.failure_score if p is None else p for p in parsed], dtype=torch.float32)
    failed = torch.tensor([float(p is None) for p in parsed])
    clipped = torch.tensor([float(len(v) >= response_length and (not v or v[-1] not in eos)) for v in verdict_ids])
    tokens = torch.tensor([float(len(v)) for v in verdict_ids])
    return Batch({"judge_score": scores, "judge_failed": failed, "judge_clipped": clipped, "judge_tokens": tokens,
                  "judge_prompt_cut": torch.tensor(cut)}, {"judge_verdict": np.asarray(texts, dtype=object)})


def judge_metrics(out: Batch) -> dict:
    """The judge's counts over the whole batch (taken out of `out`): parse failures (responses scored
    reward_model.judge.failure_score), verdicts cut at reward_model.rollout.response_length, the verdicts' mean
    length in tokens, judging prompts cut to reward_model.rollout.prompt_length."""
    failed, clipped, tokens, cut = (out.tensors.pop(k) for k in ("judge_failed", "judge_clipped", "judge_tokens",
                                                                 "judge_prompt_cut"))
    return {"reward/judge_parse_failures": float(failed.sum()),
            "reward/judge_parse_failure_ratio": float(failed.mean()) if len(failed) else 0.0,
            "reward/judge_verdicts_clipped": float(clipped.sum()),
            "reward/judge_prompts_cut": float(cut.sum()),
            "reward/judge_verdict_length/mean": float(tokens.mean()) if len(tokens) else 0.0}
