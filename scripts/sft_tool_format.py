#!/usr/bin/env python
"""Format warm start for the GSM8K tool recipe: a few hundred steps of SFT that teach a model (random weights
included) to write a hermes tool call, so that the recipe's rollouts really call the tool.

    python scripts/sft_tool_format.py --model <HF dir> --data <train.parquet> --output_dir <dir> [--steps 300]

Each training row (made by `scripts/prepare_gsm8k.py --multi-turn`) becomes the trajectory the `tool_agent` would
build at rollout, token for token: the real `ToolAgentLoop` renders the prompt (chat template + tool schemas), and a
scripted "engine" answers its requests with the teacher's turns:
    1. <tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "A"}}</tool_call>   A: the ground truth for a
       fraction --p_right of rows, a wrong number otherwise (the format is taught, not that the first try is right)
    2. (the tool's turn: the real GSM8K tool's reply, rendered by the template's tool role: no loss)
    3. #### <ground truth>
The loss covers the assistant tokens only (the loop's response mask: 1 on the model's tokens, EOS included).
A tokenizer whose chat template ignores tools (rlx's byte tokenizer) gets TOOL_TEMPLATE, saved with the model.
At the end: the share of greedy generations on held-out prompts holding a tool call that rlx's hermes parser accepts.
Output: an HF model directory (model + tokenizer) for `actor_rollout_ref.model.path`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlx.config.agent import MultiTurnConfig  # noqa: E402
from rlx.workers.rollout.agent import hermes  # noqa: E402
from rlx.workers.rollout.agent.loop import LoopContext, TokenOutput  # noqa: E402
from rlx.workers.rollout.agent.tool_agent import ToolAgentLoop  # noqa: E402
from rlx.workers.rollout.agent.tools import load_tools  # noqa: E402

TOOL_CONFIG = os.path.join(ROOT, "examples", "multiturn", "config", "tool_config", "gsm8k_tool_config.yaml")
TOOL_NAME = "calc_gsm8k_reward"
# A ChatML-style template with tools and a tool role, for tokenizers whose own template has neither; a turn ends with
# the tokenizer's EOS (what stops generation), then a newline.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\nCall a function by writing <tool_call>\n{\"name\": <function name>, \"arguments\": <JSON object>}\n"
    "</tool_call>\nFunctions:\n{% for t in tools %}{{ t['function'] | tojson }}\n{% endfor %}{{ eos_token }}\n"
    "{% endif %}"
    "{% for m in messages %}{% if not (loop.first and tools and m['role'] == 'system') %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# ---- data: rows -> the tool agent's trajectories --------------------------------------------------------------
def read_rows(path: str) -> list[dict]:
    """Rows of a parquet or jsonl file written by prepare_gsm8k.py --multi-turn."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def ensure_tool_template(tokenizer) -> bool:
    """Give `tokenizer` TOOL_TEMPLATE when its chat template does not show the tools; True when it did."""
    probe = {"type": "function", "function": {"name": "probe_tool_xyz", "parameters": {"type": "object"}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[probe], tokenize=False)
    except Exception:  # noqa: BLE001 - no template at all, or one that cannot take tools
        text = ""
    if "probe_tool_xyz" in text:
        return False
    tokenizer.chat_template = TOOL_TEMPLATE
    return True


def make_loop(tokenizer, tool_config: str = TOOL_CONFIG, max_length: int = 8192) -> ToolAgentLoop:
    """The rollout's tool agent over the recipe's tools (verl's defaults for the multi_turn keys)."""
    ctx = LoopContext(tokenizer, max_length, max_length, MultiTurnConfig(enable=True), load_tools(tool_config, None))
    return ToolAgentLoop(ctx)


def wrong_number(truth: str, rng: random.Random) -> str:
    try:
        x = float(truth)
    except ValueError:
        return str(rng.randint(1, 100))
    y = x + rng.choice([-1, 1]) * rng.randint(1, max(2, int(abs(x) // 4) + 1))
    return str(int(y)) if y == int(y) else f"{y:g}"


def teacher_turns(truth: str, rng: random.Random, p_right: float) -> list[str]:
    """The assistant's two turns: a call of the tool with an answer (right with probability p_right), the final one."""
    answer = truth if rng.random() < p_right else wrong_number(truth, rng)
    call = json.dumps({"name": TOOL_NAME, "arguments": {"answer": answer}})
    return [f"<tool_call>\n{call}\n</tool_call>", f"#### {truth}"]


class TeacherServer:
    """The tool agent's engine for one trajectory: its k-th request gets the k-th teacher turn (text + EOS)."""

    def __init__(self, tokenizer, turns: list[str]):
        self.turns = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in turns]

    async def generate(self, request) -> TokenOutput:
        return TokenOutput(self.turns.pop(0))


def build_examples(loop: ToolAgentLoop, rows: list[dict], rng: random.Random, p_right: float) -> list[dict]:
    """Per row {input_ids, loss_mask}: the tool agent's trajectory (prompt + response) and 1 on the model's tokens."""
    tok = loop.ctx.tokenizer

    async def one(row):
        truth = str(row["reward_model"]["ground_truth"])
        server = TeacherServer(tok, teacher_turns(truth, rng, p_right))
        out = await loop.run(server, prompt_ids=[], raw_chat=list(row["prompt"]), extra_info=row["extra_info"],
                             sample_index=0)
        assert not server.turns and out.metrics["tool_calls"] == 1, "the teacher's turns were not all used"
        assert out.metrics["tokenization_mismatch"] == 0, "turn-by-turn tokens differ from the rendered conversation"
        return {"input_ids": out.prompt_ids + out.response_ids,
                "loss_mask": [0] * len(out.prompt_ids) + list(out.response_mask)}

    async def run_all():
        return await asyncio.gather(*(one(r) for r in rows))

    return list(asyncio.run(run_all()))


def prompt_ids(loop: ToolAgentLoop, row: dict) -> list[int]:
    """A row's prompt as the tool agent renders it at rollout."""
    return loop._ids([dict(m) for m in row["prompt"]], tools=loop.schemas or None, add_generation_prompt=True)


# ---- training --------------------------------------------------------------------------------------------------
def collate(examples: list[dict], pad_id: int, device) -> dict:
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.bool)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = torch.tensor(e["input_ids"])
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(e["loss_mask"], dtype=torch.bool)
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device), "loss_mask": mask.to(device)}


def sft_loss(model, batch: dict) -> torch.Tensor:
    """Mean next-token cross-entropy over the tokens of loss_mask; the LM head runs on those positions only."""
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    target = batch["loss_mask"][:, 1:]  # token t+1 is predicted at position t
    logits = model.get_output_embeddings()(hidden[:, :-1][target]).float()
    return torch.nn.functional.cross_entropy(logits, batch["input_ids"][:, 1:][target])


def train(model, tokenizer, examples: list[dict], *, steps: int, batch_size: int, lr: float, seed: int = 0,
          log_every: int = 10, warmup: int = 20) -> list[float]:
    """AdamW with a linear warmup and a cosine decay; bf16 autocast on CUDA. Returns the loss of every step."""
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup)
                                              * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    rng = random.Random(seed)
    order: list[int] = []
    losses = []
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        if len(order) < batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        batch = collate([examples[order.pop()] for _ in range(min(batch_size, len(examples)))],
                        tokenizer.pad_token_id, device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = sft_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {losses[-1]:.4f}  lr {sched.get_last_lr()[0]:.2e}  "
                  f"{time.perf_counter() - t0:.1f}s", flush=True)
    model.eval()
    return losses


# ---- evaluation: greedy generations with a parsable tool call ------------------------------------------------
@torch.no_grad()
def greedy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 16) -> list[str]:
    device = next(model.parameters()).device
    texts = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for j, p in enumerate(chunk):  # left padding
            ids[j, width - len(p):] = torch.tensor(p)
            attn[j, width - len(p):] = 1
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        texts += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return texts


def tool_call_stats(texts: list[str], tool_name: str = TOOL_NAME) -> dict:
    """Shares of texts with a tool call the hermes parser accepts, and with one naming `tool_name`."""
    calls = [hermes.parse(t)[1] for t in texts]
    ok = [[c for c in cs if c.error is None] for cs in calls]
    return {"parsable": sum(bool(c) for c in ok) / max(1, len(texts)),
            "right_tool": sum(any(c.name == tool_name for c in cs) for cs in ok) / max(1, len(texts))}


# ---- main ------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF model directory to start from")
    ap.add_argument("--data", required=True, help="train rows (parquet/jsonl) of prepare_gsm8k.py --multi-turn")
    ap.add_argument("--eval_data", default=None, help="held-out rows (default: the last --eval_rows of --data)")
    ap.add_argument("--output_dir", required=True)
    ap.add_argument("--tool_config", default=TOOL_CONFIG)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--p_right", type=float, default=0.5, help="share of rows whose tool call has the right answer")
    ap.add_argument("--train_rows", type=int, default=2048, help="rows turned into training examples")
    ap.add_argument("--eval_rows", type=int, default=64)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    """The whole warm start; returns the losses and the held-out tool-call shares before and after."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if ensure_tool_template(tokenizer):
        print("[sft] the tokenizer's chat template ignores tools: using TOOL_TEMPLATE (saved with the model)")
    rows = read_rows(args.data)
    eval_rows = read_rows(args.eval_data)[:args.eval_rows] if args.eval_data else rows[-args.eval_rows:]
    rows = rows[:args.train_rows] if args.eval_data else rows[:-args.eval_rows][:args.train_rows]
    loop = make_loop(tokenizer, args.tool_config)
    examples = build_examples(loop, rows, random.Random(args.seed), args.p_right)
    lengths = [len(e["input_ids"]) for e in examples]
    print(f"[sft] {len(examples)} examples, {sum(lengths) / len(lengths):.0f} tokens on average (max {max(lengths)}),"
          f" {sum(sum(e['loss_mask']) for e in examples) / len(examples):.0f} of them in the loss; "
          f"{time.perf_counter() - t0:.1f}s")

    save_dtype = AutoConfig.from_pretrained(args.model).dtype or torch.float32  # the weights go back in their dtype
    save_dtype = getattr(torch, save_dtype) if isinstance(save_dtype, str) else save_dtype
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device)  # fp32 master
    prompts = [prompt_ids(loop, r) for r in eval_rows]
    before = tool_call_stats(greedy(model, tokenizer, prompts[:16], args.max_new_tokens))
    print(f"[sft] before: {before}")
    t1 = time.perf_counter()
    losses = train(model, tokenizer, examples, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                   seed=args.seed)
    train_s = time.perf_counter() - t1
    texts = greedy(model, tokenizer, prompts, args.max_new_tokens)
    stats = tool_call_stats(texts)
    print(f"[sft] loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps ({train_s:.1f}s)")
    print(f"[sft] greedy sample: {texts[0]!r}")
    print(f"[sft] held-out greedy generations with a parsable tool call: {stats['parsable']:.1%} "
          f"(naming {TOOL_NAME}: {stats['right_tool']:.1%}) of {len(texts)}")

    model.to(save_dtype).save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    print(f"[sft] saved {args.output_dir}; total {time.perf_counter() - t0:.1f}s")
    return {"losses": losses, "before": before, "after": stats, "train_s": train_s, "texts": texts}


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
