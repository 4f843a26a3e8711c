"""`trainer.rollout_data_dir` / `trainer.validation_data_dir` (verl's keys): each training step's rollouts, or each
validation's samples, written as `<dir>/<step>.jsonl`, one line per response: `input` (the prompt), `output` (the
response), `gts` (the ground truth), `score` (the response's total reward), `step`, and the reward function's extra
values that have one entry per response. Text is decoded without special tokens, as verl writes it."""
from __future__ import annotations

import json
import os

from rlx.protocol import Batch


def decoded(batch: Batch, tokenizer) -> tuple[list[str], list[str]]:
    """The prompts and responses of a generated batch as text (padding and special tokens dropped)."""
    resp_len = batch["responses"].shape[1]
    prompts = batch["input_ids"][:, :-resp_len]
    return (tokenizer.batch_decode(prompts.tolist(), skip_special_tokens=True),
            tokenizer.batch_decode(batch["responses"].tolist(), skip_special_tokens=True))


def write_generations(directory: str, step: int, inputs: list, outputs: list, gts: list, scores: list,
                      extras: dict | None = None) -> str:
    """Write `<directory>/<step>.jsonl`; returns its path."""
    os.makedirs(directory, exist_ok=True)
    n = len(inputs)
    columns = {"input": inputs, "output": outputs, "gts": gts, "score": scores, "step": [step] * n}
    columns.update({k: list(v) for k, v in (extras or {}).items() if len(v) == n and k not in columns})
    path = os.path.join(directory, f"{step}.jsonl")
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({k: v[i] for k, v in columns.items()}, ensure_ascii=False, default=str) + "\n")
    return path


def dump_batch(directory: str, step: int, batch: Batch, tokenizer, extras: dict | None = None) -> str:
    """A scored generated batch (`token_level_scores`) to `<directory>/<step>.jsonl`."""
    inputs, outputs = decoded(batch, tokenizer)
    scores = batch["token_level_scores"].sum(-1).tolist()
    return write_generations(directory, step, inputs, outputs, list(batch["ground_truth"]), scores, extras)
