"""What the engines ask of the HF model: per-token outputs at chosen positions only, never the full logits.

`apply_token_head(model, role, chunk_size)` replaces the forward of the (unwrapped) HF model, before FSDP wraps
it, with one that runs the decoder, picks the hidden states at `index` (flat positions of `[rows, seq]`) and
applies the head there:

* actor / ref (`AutoModelForCausalLM`): log-prob of `targets` (and entropy when asked) at temperature `T`,
  through `rlx.ops.log_prob_head`: the chunked head never materialises `[tokens, vocab]` logits when
  `chunk_size > 0` (`model.use_fused_kernels`; its per-chunk math in torch or in Triton kernels,
  `fused_kernel_options.impl_backend`, see `fused_head_backend`), else the full-logits path;
* critic (`AutoModelForTokenClassification` with one label): the value; the reward model (role `reward`, the
  same head, loaded from a sequence-classification checkpoint): its score.

The replaced forward is the module's own forward, so FSDP1/FSDP2 gather and free the head's parameters around
it as they do around any forward, and the outputs are the root module's outputs (their backward hooks fire).

Packed rows (remove padding) attend within each of their sequences: rlx.engine.attention.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _mask_mapping(model: nn.Module) -> dict | None:
    """The mask of a packed row, which needs no mask tensor (the attention reads cu_seq_lens): per-layer-type
    masks of None for a model whose config has `layer_types` (Qwen2-style decoders take that mapping); None for
    one that builds its single mask itself (Llama: `rlx.engine.attention` makes that mask None too)."""
    types = getattr(model.config, "layer_types", None)
    if not types:
        return None
    return {t: None for t in set(types) | {"full_attention"}}


def fused_head_backend(model_cfg, device: torch.device) -> str:
    """`model_cfg.fused_kernel_options.impl_backend` (torch | triton) for the fused head on `device`; triton where
    it cannot run (no package, or no GPU without Triton's interpreter) is a ValueError naming the key and the fix."""
    backend = model_cfg.fused_kernel_options.impl_backend
    if backend == "triton":
        from rlx.config.device import triton_head_problem

        problem = triton_head_problem(device.type)
        if problem:
            raise ValueError(problem)
    return backend


def apply_token_head(model: PreTrainedModel, role: str, chunk_size: Optional[int], *,
                     entropy_chunk_size: Optional[int] = None, entropy_checkpointing: bool = False,
                     backend: str = "torch") -> None:
    """Replace `model.forward` (an HF causal LM, or a one-label token classifier for the critic); see module doc.

    New forward: `(input_ids, position_ids, attention_mask, index, targets=None, temperature=1.0,
    with_entropy=False, cu_seq_lens=None, sp_index=None, with_sum_pi_squared=False)` -> `(log_probs [N], entropy [N]
    | None)` (plus `sum_pi_squared [N]`, no gradient, with `with_sum_pi_squared`) or `values [N]`.
    `attention_mask` is the `[rows, seq]` padding mask, or None for one packed row with `cu_seq_lens`.
    With Ulysses (`sp_index` given) the ids are this rank's slice of the packed row, `index`/`targets` the
    scored tokens inside it, and the outputs are gathered over the group at `sp_index` (see `ulysses`).
    `entropy_chunk_size` / `entropy_checkpointing`: how the full-logits head (no `chunk_size`) computes the entropy
    (verl's entropy_from_logits_with_chunking / entropy_checkpointing; see `rlx.ops.log_prob_head`).
    `backend`: the chunked head's implementation (`fused_head_backend`); the sum of squared probabilities is torch's.
    """
    from rlx.ops.log_prob_head import log_probs_from_hidden, sum_pi_squared_from_hidden

    base = model.base_model
    critic = role in ("critic", "reward")  # the one-label head: values, or the reward model's score
    # HF's `score` / lm_head: read as a Linear (its weight and bias), which torch's Module attributes cannot type
    head = cast(nn.Linear, model.score if critic else model.get_output_embeddings())
    dropout = getattr(model, "dropout", None) if critic else None

    def forward(input_ids, position_ids, attention_mask, index, targets=None, temperature=1.0, with_entropy=False,
                cu_seq_lens=None, sp_index=None, with_sum_pi_squared=False):
        kwargs = {}
        if cu_seq_lens is not None:
            longest = int((cu_seq_lens[1:] - cu_seq_lens[:-1]).max())
            kwargs = dict(cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens, max_length_q=longest,
                          max_length_k=longest)
            attention_mask = _mask_mapping(model)
        hidden = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False, **kwargs).last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1])
        local_len = hidden.shape[0]
        hidden = hidden.index_select(0, index)
        if critic:
            if dropout is not None:
                hidden = dropout(hidden)
            out = head(hidden)[:, 0].float()
        else:
            out = log_probs_from_hidden(hidden, head.weight, head.bias, targets, temperature,
                                        chunk_size=chunk_size, with_entropy=with_entropy,
                                        entropy_chunk_size=entropy_chunk_size,
                                        entropy_checkpointing=entropy_checkpointing, backend=backend)
            if with_sum_pi_squared:
                out = out + (sum_pi_squared_from_hidden(hidden, head.weight, head.bias, temperature,
                                                        chunk_size=chunk_size),)
        if sp_index is None:
            return out
        # Ulysses: this rank scored the tokens of its slice; every rank of the group gets all of them, in order
        from rlx.engine.ulysses import gather_scored

        def gather(t):
            return None if t is None else gather_scored(t, index, local_len, sp_index, model._rlx_sp_group)

        return gather(out) if critic else tuple(gather(t) for t in out)

    model.forward = forward
