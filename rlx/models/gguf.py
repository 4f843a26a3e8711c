"""GGUF -> HF directory: a model file of llama.cpp's format becomes an ordinary HF model directory.

transformers reads a GGUF file itself (`from_pretrained(dir, gguf_file=...)`, through the `gguf` package): it
dequantizes every tensor to fp32 and builds the tokenizer, with its chat template, from the file's metadata. The model
it returns is marked as quantized and `save_pretrained` refuses it, so `convert_gguf` copies its (dequantized) weights
into a plain model of the same config and saves that: safetensors in fp32 (the dequantized values exactly), the
config, the tokenizer files and the chat template. HF, the FSDP workers and vLLM then load the directory like any
other.
"""
from __future__ import annotations

import os
from pathlib import Path

from rlx.models.hf_compat import dtype_kwargs
from rlx.models.store import save_whole


def load_gguf(gguf_path: str):
    """(model, tokenizer) as transformers loads them from `gguf_path` (fp32, dequantized)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = os.path.split(os.path.abspath(gguf_path))
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, **dtype_kwargs(torch.float32))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    return model.eval(), tokenizer


def _plain_copy(model):
    """A model of `model`'s class and config without the GGUF quantization mark, holding the same weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config_dict.pop("_model_name_or_path", None)
    config_dict["dtype"] = "float32"
    config = AutoConfig.for_model(**config_dict)
    plain = AutoModelForCausalLM.from_config(config, **dtype_kwargs(torch.float32))
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert not unexpected and set(missing) <= tied, (missing, unexpected)
    if tied:
        plain.tie_weights()
    return plain.eval()


def convert_gguf(gguf_path: str, out_dir: str) -> str:
    """Write the HF directory of `gguf_path` to `out_dir` (atomically: a temp folder renamed at the end, so no reader
    ever sees half a model) and return `out_dir`."""
    from transformers import GenerationConfig

    model, tokenizer = load_gguf(gguf_path)
    plain = _plain_copy(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    plain.config.eos_token_id = tokenizer.eos_token_id
    plain.config.pad_token_id = tokenizer.pad_token_id
    plain.generation_config = GenerationConfig(bos_token_id=plain.config.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    target = Path(out_dir)
    save_whole(plain, tokenizer, target)
    return str(target)
