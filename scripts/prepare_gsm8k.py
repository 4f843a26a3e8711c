#!/usr/bin/env python
"""Convert GSM8K jsonl (``train.jsonl`` / ``test.jsonl`` with ``question`` and ``answer``) into verl-format parquet.

The jsonl files are OpenAI's grade-school-math repository's ``grade_school_math/data/{train,test}.jsonl``
(https://github.com/openai/grade-school-math, MIT license); download them first (docs/data.md). Run with the
project's interpreter:

    .venv/bin/python scripts/prepare_gsm8k.py --input_dir <dir with train.jsonl/test.jsonl> --output_dir ~/data/gsm8k

Writes ``train.parquet`` and ``test.parquet`` (for each split whose jsonl exists). Nothing is downloaded.

With ``--multi-turn`` the rows are verl's tool-agent rows: a system message telling the model to check its answer
with the ``calc_gsm8k_reward`` tool, ``agent_name: tool_agent``, and
``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`` (the tool's ground truth), for
``examples/multiturn/run_grpo_gsm8k_tool.sh`` (docs/agent.md).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
ONE_SHOT = ("Example:\nQuestion: Tom has 3 boxes with 4 apples each. He eats 2 apples. How many apples are left?\n"
            "Answer: 3 * 4 = 12 apples. 12 - 2 = 10 apples are left.\n#### 10\n\nQuestion: ")
PROMPT_STYLES = {
    "verl": lambda q: f"{q} {INSTRUCTION}",  # verl's examples/data_preprocess/gsm8k.py
    "short": lambda q: f"{q} Think step by step, then give the final answer as a number after \"####\".",
    "oneshot": lambda q: f"{ONE_SHOT}{q}\nEnd with the final answer as a number after \"####\".",
}
"""--prompt-style: how the question becomes the user message (verl's by default; docs/real_model.md compares them
on SmolLM2-135M-Instruct)."""
DATA_SOURCE = "openai/gsm8k"
TOOL_NAME = "calc_gsm8k_reward"
TOOL_SYSTEM = ("Solve the math problem step by step. When you have an answer, submit it with the "
               f"`{TOOL_NAME}` tool to learn whether it is right, and revise it if needed. End with the final "
               "answer written as `#### <answer>`.")


def extract_answer(answer: str) -> str:
    match = re.search(r"####\s*(.+?)\s*$", answer.strip())
    if match is None:
        raise ValueError(f"GSM8K answer without a '#### <number>' line: {answer[-200:]!r}")
    return match.group(1).replace(",", "").strip()


def convert_rows(records: list[dict], split: str, multi_turn: bool = False, prompt_style: str = "verl") -> list[dict]:
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"--prompt-style {prompt_style!r} is unknown. Fix: use one of {sorted(PROMPT_STYLES)}.")
    render = PROMPT_STYLES[prompt_style]
    rows = []
    for idx, rec in enumerate(records):
        question, answer = rec["question"], rec["answer"]
        truth = extract_answer(answer)
        row = {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": render(question)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": idx, "answer": answer, "question": question},
        }
        if multi_turn:
            row["prompt"] = [{"role": "system", "content": TOOL_SYSTEM}] + row["prompt"]
            row["agent_name"] = "tool_agent"
            row["extra_info"].update(need_tools_kwargs=True,
                                     tools_kwargs={TOOL_NAME: {"create_kwargs": {"ground_truth": truth}}})
        rows.append(row)
    return rows


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input_dir", required=True, help="directory with train.jsonl and/or test.jsonl")
    parser.add_argument("--output_dir", "--local_dir", required=True, help="where to write the parquet files")
    parser.add_argument("--multi-turn", "--multi_turn", action="store_true",
                        help="verl's tool-agent rows (agent_name, extra_info.tools_kwargs) for the GSM8K tool recipe")
    parser.add_argument("--prompt-style", "--prompt_style", default="verl", choices=sorted(PROMPT_STYLES),
                        help="how the question is asked (default: verl's instruction)")
    args = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq

    input_dir, output_dir = os.path.expanduser(args.input_dir), os.path.expanduser(args.output_dir)
    done = 0
    for split in ("train", "test"):
        src = os.path.join(input_dir, f"{split}.jsonl")
        if not os.path.exists(src):
            print(f"[prepare_gsm8k] {src} not found; skipping the {split} split", file=sys.stderr)
            continue
        rows = convert_rows(read_jsonl(src), split, multi_turn=args.multi_turn, prompt_style=args.prompt_style)
        os.makedirs(output_dir, exist_ok=True)
        dst = os.path.join(output_dir, f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(rows), dst)
        print(f"[prepare_gsm8k] {split}: {len(rows)} rows -> {dst}")
        done += 1
    if not done:
        print(f"[prepare_gsm8k] no train.jsonl or test.jsonl in {input_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
