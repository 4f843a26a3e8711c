#!/usr/bin/env python
"""How much probability a model with a frozen output head and final norm can put on a set of tokens, at a sampling
temperature: what LoRA on the decoder layers can reach at best (the adapters move the last hidden state, nothing
after it).

    python benchmarks/head_ceiling.py [--model builtin://tiny-qwen2] [--tokens 0123456789]

The final RMSNorm maps any hidden state to norm sqrt(hidden_size) (times its frozen weight), and the frozen head
turns that into logits; this searches that sphere (Adam on the direction, a few random starts) for the largest
probability of (a) any of the tokens and (b) one given token, per temperature. On the built-in random tiny model
(head rows of norm ~0.23, hidden 128) the answer at temperature 1 is ~10% and ~5%: why `quickstart_lora` samples at
a lower temperature (see rlx/trainer/config/quickstart_lora.yaml).
"""
from __future__ import annotations

import argparse

import torch


def best_mass(head: torch.Tensor, norm_weight: torch.Tensor, ids: list[int], temperature: float,
              starts: int = 2, iters: int = 1000) -> float:
    """max over hidden states h of sum_{t in ids} softmax(head @ (norm_weight * h / rms(h)) / temperature)_t."""
    d = head.shape[1]
    best = 0.0
    for s in range(starts):
        h = torch.randn(d, generator=torch.Generator().manual_seed(s)).requires_grad_(True)
        opt = torch.optim.Adam([h], lr=0.05)
        for _ in range(iters):
            x = norm_weight * (h / h.norm() * d ** 0.5)  # RMSNorm's output: norm sqrt(d) before its weight
            log_mass = torch.log_softmax(head @ x / temperature, -1)[ids].logsumexp(0)
            opt.zero_grad()
            (-log_mass).backward()
            opt.step()
        best = max(best, float(log_mass.detach().exp()))
    return best


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.models import resolve_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin://tiny-qwen2")
    ap.add_argument("--tokens", default="0123456789", help="characters, one token each")
    ap.add_argument("--temperatures", default="1,0.5,0.3,0.2")
    args = ap.parse_args()
    path = resolve_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    ids = [tok(c, add_special_tokens=False)["input_ids"][0] for c in args.tokens]
    head = model.get_output_embeddings().weight.detach()
    norm = model.base_model.norm.weight.detach()
    print(f"{args.model}: vocab {head.shape[0]}, hidden {head.shape[1]}, head row norm mean "
          f"{head.norm(dim=1).mean():.3f}, final norm weight mean {norm.mean():.3f}")
    print("temperature | max P(any of the tokens) | max P(one given token)")
    for t in (float(x) for x in args.temperatures.split(",")):
        print(f"{t:11g} | {best_mass(head, norm, ids, t):24.3f} | {best_mass(head, norm, ids[:1], t):22.3f}")


if __name__ == "__main__":
    main()
