"""GGUF -> HF directory (rlx.models.gguf).

The test writes a tiny llama GGUF file (2 layers, a byte-level BPE tokenizer and a chat template in its metadata) with
gguf's own writer. Its helpers serve the built-in models' tests too (tests/unit/test_model_registry.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from rlx.models.gguf import convert_gguf

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 32, 64, 4, 2, 2


def write_tiny_gguf(path: Path, seed: int = 0, arch: str = "llama") -> dict[str, np.ndarray]:
    """A GGUF file with F32 tensors and a gpt2-style (byte-level BPE) tokenizer in its metadata; its tensors by GGUF
    name. `arch` llama: tied head (as SmolLM2's file); qwen2: q/k/v biases and a head of its own (as
    Qwen2.5-Coder-0.5B-Instruct's file)."""
    import gguf
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he", "1 2", "3 5"]
    tokens = SPECIALS + alphabet + [m.replace(" ", "") for m in merges]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    vocab = len(tokens)
    rng = np.random.default_rng(seed)

    tensors = {}

    def t(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    def add(name, value):
        tensors[name] = value
        w.add_tensor(name, value)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if arch == "llama":
        w.add_rope_dimension_count(HIDDEN // HEADS)
        w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm" if arch == "llama" else "qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    kv = KV_HEADS * HIDDEN // HEADS
    add("token_embd.weight", t(vocab, HIDDEN))
    if arch == "qwen2":
        add("output.weight", t(vocab, HIDDEN))
    add("output_norm.weight", 1 + t(HIDDEN))
    for i in range(LAYERS):
        for name, shape in [("attn_norm", (HIDDEN,)), ("ffn_norm", (HIDDEN,))]:
            add(f"blk.{i}.{name}.weight", 1 + t(*shape))
        for name, shape in [("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (kv, HIDDEN)), ("attn_v", (kv, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)),
                            ("ffn_down", (HIDDEN, FFN))]:
            add(f"blk.{i}.{name}.weight", t(*shape))
        if arch == "qwen2":
            for name, size in [("attn_q", HIDDEN), ("attn_k", kv), ("attn_v", kv)]:
                add(f"blk.{i}.{name}.bias", t(size))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def gguf_logits_equal(hf_dir: Path, gguf_file: Path, messages: list[dict]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    ref_tok = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ref_ids = ref_tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)
    assert torch.equal(ids["input_ids"], ref_ids["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, ref(**ref_ids).logits)
    return model, tok, ids


def test_tiny_gguf_converts_to_an_equal_hf_directory(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src)
    out = Path(convert_gguf(str(src), str(tmp_path / "hf")))
    names = set(os.listdir(out))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    model, tok, ids = gguf_logits_equal(out, src, [{"role": "user", "content": "the 12 + 35"}])
    assert tok.decode(ids["input_ids"][0]).startswith("<|im_start|>user\nthe 12 + 35<|im_end|>")
    # EOS is the file's; the pad is the tokenizer's (the EOS when the file names none), alike in config,
    # generation config and tokenizer
    assert (tok.eos_token, tok.bos_token) == ("<|im_end|>", "<|im_start|>")
    assert model.config.eos_token_id == model.generation_config.eos_token_id == tok.eos_token_id == 2
    assert model.config.pad_token_id == model.generation_config.pad_token_id == tok.pad_token_id
    assert "quantization_config" not in (out / "config.json").read_text()
    assert model.config.num_hidden_layers == LAYERS and model.config.tie_word_embeddings
