"""Fallback rollout with HF `generate` on a plain (unsharded) copy of the policy in the actor worker.

The copy is refreshed from the FSDP actor before every generation through the same `sync_weights` call the
vLLM rollout uses, so both rollouts see exactly the trained weights and the FSDP module is never driven
through `generate` (whose per-rank stopping would desynchronise FSDP collectives).
"""
from __future__ import annotations

from typing import Iterable

import torch

from rlx.protocol import Batch
from rlx.workers.rollout.base import assemble_output


class HFRollout:
    def __init__(self, model_path: str, *, max_response_length: int, pad_token_id: int, eos_token_id,
                 device: torch.device, dtype: torch.dtype = torch.float32, calculate_log_probs: bool = False,
                 micro_batch_size: int = 64, trust_remote_code: bool = False, ignore_eos: bool = False,
                 offload_when_released: bool = False):
        """`offload_when_released`: `release()` moves the model to the CPU (and frees CUDA's cache), `wake_up()`
        brings it back (the judge's engine between scoring calls); off, nothing sleeps (the actor's copy)."""
        from transformers import AutoModelForCausalLM

        from rlx.models import resolve_model_path
        from rlx.models.hf_compat import dtype_kwargs

        model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_path), **dtype_kwargs(dtype),
                                                     trust_remote_code=trust_remote_code, attn_implementation="sdpa")
        # transformers types PreTrainedModel.to as a functools.wraps wrapper that still expects `self`
        self.model = model.to(device).eval()  # type: ignore[arg-type]
        self.device, self.max_response_length = device, max_response_length
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.calculate_log_probs, self.micro_batch_size = calculate_log_probs, micro_batch_size
        self.ignore_eos = ignore_eos  # rollout.ignore_eos: generate max_response_length tokens, EOS included
        self.offload_when_released = offload_when_released

    @torch.no_grad()
    def sync_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
        own = dict(self.model.named_parameters())
        own.update(dict(self.model.named_buffers()))
        for name, tensor in named_params:
            own[name].copy_(tensor.to(own[name].dtype))

    @torch.no_grad()
    def generate_sequences(self, prompts: Batch) -> Batch:
        meta = prompts.meta
        n, do_sample = int(meta.get("n", 1)), bool(meta.get("do_sample", True))
        temperature = float(meta.get("temperature", 1.0))
        if temperature <= 0:
            do_sample = False
        gen = torch.Generator(device=self.device).manual_seed(int(meta.get("seed", 0)))
        ids = prompts["input_ids"].repeat_interleave(n, 0)
        mask = prompts["attention_mask"].repeat_interleave(n, 0)
        responses, log_probs = [], []
        for start in range(0, ids.shape[0], self.micro_batch_size):
            r, lp = self._generate(ids[start:start + self.micro_batch_size], mask[start:start + self.micro_batch_size],
                                   do_sample, temperature, int(meta.get("top_k", -1)), float(meta.get("top_p", 1.0)),
                                   gen)
            responses.append(r)
            log_probs.append(lp)
        return assemble_output(ids, mask, torch.cat(responses), self.eos_token_id, self.pad_token_id,
                               torch.cat(log_probs) if self.calculate_log_probs else None, ignore_eos=self.ignore_eos)

    @torch.no_grad()
    def generate_ids(self, prompts: list[list[int]], max_new_tokens: list[int], meta: dict, gen: torch.Generator,
                     pad_to: int = 0) -> list[tuple[list[int], list[float]]]:
        """One batch of requests of the agent loop: prompts of any lengths (left-padded here to at least `pad_to`, as
        the sync path's batch is), each with its own token budget; per row the generated ids up to and including
        the first EOS (all of them with ignore_eos) and their log-probs."""
        do_sample, temperature = bool(meta.get("do_sample", True)), float(meta.get("temperature", 1.0))
        if temperature <= 0:
            do_sample = False
        width = max([pad_to] + [len(p) for p in prompts])
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p):] = 1
        out, lps = self._generate(ids, mask, do_sample, temperature, int(meta.get("top_k", -1)),
                                  float(meta.get("top_p", 1.0)), gen, max_new_tokens=max(max_new_tokens))
        eos = set(self.eos_token_id if isinstance(self.eos_token_id, list) else [self.eos_token_id])
        rows = []
        for i, budget in enumerate(max_new_tokens):
            toks = out[i, :budget].tolist()
            if not self.ignore_eos:
                end = next((t for t, tok in enumerate(toks) if tok in eos), None)
                toks = toks if end is None else toks[:end + 1]
            rows.append((toks, lps[i, :len(toks)].tolist()))
        return rows

    def _generate(self, ids, mask, do_sample, temperature, top_k, top_p, gen, max_new_tokens=None):
        """Sampling loop with an explicit generator (reproducible per rank) and a KV cache."""
        ids, mask = ids.to(self.device), mask.to(self.device)
        B, R = ids.shape[0], max_new_tokens or self.max_response_length
        out = torch.full((B, R), self.pad_token_id, dtype=torch.long, device=self.device)
        lps = torch.zeros((B, R), dtype=torch.float32, device=self.device)
        eos = torch.tensor(self.eos_token_id if isinstance(self.eos_token_id, list) else [self.eos_token_id],
                           device=self.device)
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        past, cur_ids, cur_pos = None, ids, pos
        for t in range(R):
            o = self.model(input_ids=cur_ids, attention_mask=mask, position_ids=cur_pos, past_key_values=past,
                           use_cache=True)
            past = o.past_key_values
            logits = o.logits[:, -1].float()
            if do_sample:
                logits = logits / temperature
                logits = _top_k_top_p(logits, top_k, top_p)
                probs = torch.softmax(logits, -1)
                tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            else:
                tok = logits.argmax(-1)
            lp = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
            tok = torch.where(done, torch.full_like(tok, self.pad_token_id), tok)
            out[:, t], lps[:, t] = tok, torch.where(done, torch.zeros_like(lp), lp)
            if not self.ignore_eos:
                done |= torch.isin(tok, eos)
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=self.device)], dim=1)
            cur_pos = cur_pos[:, -1:] + 1
            cur_ids = tok[:, None]
        return out.cpu(), lps.cpu()

    def wake_up(self, *tags: str) -> None:
        if self.offload_when_released:
            self.model.to(self.device)

    def release(self) -> None:
        if self.offload_when_released:
            self.model.to("cpu")
            torch.cuda.empty_cache()


def _top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        remove = cum - torch.softmax(sorted_logits, -1) > top_p
        logits = logits.scatter(-1, idx, sorted_logits.masked_fill(remove, float("-inf")))
    return logits
