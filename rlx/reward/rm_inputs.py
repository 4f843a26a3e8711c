"""What a reward model reads: the generated sequences as its own tokenizer writes them.

When the reward model shares the actor's tokenizer (same vocabulary and chat template), it scores the actor's own
token ids (prompt + response, as generated). Otherwise (verl's `reward_model.model.input_tokenizer`, or a reward
model whose tokenizer differs) each response is decoded with the actor's tokenizer, the actor's end-of-sequence
text dropped, appended to the prompt's chat messages as the assistant's turn, and the conversation written with
the reward model's chat template (no generation prompt; a leading BOS text removed, since the tokenizer adds its
own special tokens), as verl's reward loop does. Rows are right-padded; the score is read at each row's last
valid token (`rlx.engine.packing.last_token_inputs`).
"""
from __future__ import annotations

import torch

from rlx.protocol import Batch


def same_tokenizer(a, b) -> bool:
    """True when two tokenizers write the same ids for the same conversation: vocabulary and chat template."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


def actor_sequences(batch: Batch) -> Batch:
    """The generated rows as they are: `input_ids`, `attention_mask`, `position_ids` (prompt left-padded, response
    right-padded)."""
    return batch.select("input_ids", "attention_mask", "position_ids")


def rm_conversation(messages, response: str) -> list[dict]:
    """The prompt's chat messages (or its text as one user message) with the response as the assistant's turn."""
    chat = [dict(m) for m in messages] if isinstance(messages, (list, tuple)) else \
        [{"role": "user", "content": str(messages)}]
    return chat + [{"role": "assistant", "content": response}]


def retemplated(batch: Batch, actor_tok, rm_tok, max_length: int | None = None) -> Batch:
    """`batch` re-written for the reward model (see module doc); with `max_length`, a longer row keeps its last
    `max_length` tokens."""
    chats = batch.non_tensors.get("raw_chat")
    if chats is None:
        chats = batch["raw_prompt"]
    texts = []
    for chat, resp, mask in zip(chats, batch["responses"], batch["response_mask"]):
        response = actor_tok.decode(resp[mask.bool()].tolist())
        if actor_tok.eos_token:
            response = response.replace(actor_tok.eos_token, "")
        text = rm_tok.apply_chat_template(rm_conversation(chat, response), add_generation_prompt=False,
                                          tokenize=False)
        if rm_tok.bos_token and text.startswith(rm_tok.bos_token):
            text = text[len(rm_tok.bos_token):]
        texts.append(text)
    ids = [rm_tok(t, add_special_tokens=True)["input_ids"] for t in texts]
    if max_length:
        ids = [x[-max_length:] for x in ids]
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), rm_tok.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, :len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, :len(x)] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return Batch({"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids})


def place_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """`[rows]` scores -> `[rows, R]` token-level scores: each on its response's last valid token (verl's layout;
    a row without response tokens gets nothing)."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    lengths = response_mask.long().sum(-1)
    rows = torch.nonzero(lengths > 0).flatten()
    out[rows, lengths[rows] - 1] = scores[rows].float()
    return out
