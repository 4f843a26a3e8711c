"""The rollout interface shared by the HF-generate and vLLM rollouts.

A rollout lives inside the actor worker process. The worker calls, for every generation:

    rollout.wake_up("weights")                 # vLLM sleep mode: weights back on the GPU (no-op for HF)
    rollout.sync_weights(named_full_params)   # iterator of (name, full tensor) from the FSDP actor
    rollout.wake_up("kv_cache")                # once the FSDP shards are back on the host (param offload)
    out = rollout.generate_sequences(prompts)  # prompts: Batch, see below
    rollout.release()                          # free KV cache / sleep between rollouts (no-op for HF)
(`sync_weights` and `generate_sequences` wake what they need themselves when the worker did not.)

`prompts` holds LEFT-padded tensors `input_ids`, `attention_mask`, `position_ids` of shape [B, P] and meta
`{"n": int, "do_sample": bool, "temperature": float, "top_p": float, "top_k": int, "seed": int}` (the worker
fills these from the rollout config, or from `rollout.val_kwargs` for validation).

The result holds B*n rows, the n samples of prompt i contiguous (rows i*n .. i*n+n-1), with tensors:
    prompts        [B*n, P]    the left-padded prompt ids
    responses      [B*n, R]    right-padded with pad_token_id, R = data.max_response_length exactly
    response_mask  [B*n, R]    1 up to and including the EOS token, 0 after (with rollout.ignore_eos: 1 on every
                               generated token, EOS tokens included)
    input_ids      [B*n, P+R]  cat(prompts, responses)
    attention_mask [B*n, P+R]  cat(prompt mask, response mask)
    position_ids   [B*n, P+R]  cumsum(attention_mask) - 1, clipped at 0
    rollout_log_probs [B*n, R] (only when rollout.calculate_log_probs) log-probs of the sampled tokens
All on CPU, int64 ids/masks, float32 log-probs.
"""
from __future__ import annotations

from typing import Iterable, Protocol

import torch

from rlx.protocol import Batch


class Rollout(Protocol):
    def wake_up(self, *tags: str) -> None: ...

    def sync_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def generate_sequences(self, prompts: Batch) -> Batch: ...

    def release(self) -> None: ...


def assemble_output(prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
                    eos_token_id: int | list[int], pad_token_id: int,
                    rollout_log_probs: torch.Tensor | None = None, ignore_eos: bool = False) -> Batch:
    """Build the rollout result from repeated prompts [N, P] and raw responses [N, R] (right-padded).

    With `ignore_eos` the engine generated past EOS and every generated token counts: a row ends only where the
    engine stopped (max length), never at an EOS token."""
    eos_ids = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    is_eos = torch.isin(responses, eos_ids)
    # 1 up to and including the first EOS
    after_eos = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) > 0
    if ignore_eos:
        after_eos = torch.zeros_like(after_eos)
    response_mask = (~after_eos).long()
    responses = responses.masked_fill(after_eos, pad_token_id)
    attention_mask = torch.cat([prompt_mask.long(), response_mask], dim=1)
    position_ids = (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)
    tensors = {
        "prompts": prompts.long(),
        "responses": responses.long(),
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts.long(), responses.long()], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }
    if rollout_log_probs is not None:
        tensors["rollout_log_probs"] = (rollout_log_probs.float() * response_mask).float()
    return Batch(tensors)
