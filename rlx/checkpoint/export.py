"""Exports beside a checkpoint, never loaded back by rlx: a plain HF model directory (config, safetensors, tokenizer)
for `from_pretrained` and vLLM, and a LoRA adapter alone in peft's layout. Collective: every rank gathers, rank 0
writes."""
from __future__ import annotations

import json
import os
import shutil

import torch

from rlx.checkpoint.files import atomic_write, barrier, rank_world


def _unwrap_hf(module):
    from transformers import PreTrainedModel

    inner = getattr(module, "_fsdp_wrapped_module", module)  # FSDP1 root
    inner = getattr(inner, "_checkpoint_wrapped_module", inner)
    cls = next(c for c in type(inner).__mro__ if issubclass(c, PreTrainedModel)
               and not c.__name__.startswith("FSDP"))  # FSDP2 prepends a dynamic FSDP<cls> subclass
    return inner, cls


def _persistent_buffers(module):
    from rlx.engine.weights import clean_param_name

    for mod_name, mod in module.named_modules():
        for name, buf in mod._buffers.items():
            if buf is not None and name not in mod._non_persistent_buffers_set:
                yield clean_param_name(f"{mod_name}.{name}" if mod_name else name), buf


def export_adapter(engine, out_dir: str) -> None:
    """Write the engine's LoRA adapter alone (peft's adapter_config.json + adapter_model.safetensors), loadable
    with `PeftModel.from_pretrained(base, out_dir)`. Collective; rank 0 writes."""
    from rlx.engine.lora import adapter_params, save_adapter
    from rlx.engine.weights import iter_full_params

    if engine.lora is None:
        raise ValueError("checkpoint save_contents has lora_adapter but the model has no LoRA adapters; set "
                         "model.lora_rank > 0 or drop lora_adapter from save_contents")
    rank, _ = rank_world()
    tensors = {k: v.clone() for k, v in adapter_params(iter_full_params(engine.module, to_cpu=True))}
    if rank == 0:
        hf, _ = _unwrap_hf(engine.module)
        tmp = out_dir.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_adapter(engine.lora, tensors, tmp, base_model_path=getattr(hf.config, "_name_or_path", None))
        _make_readable(tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    barrier()


def export_hf(module, out_dir: str, tokenizer=None, dtype: torch.dtype | None = None,
              max_shard_bytes: int = 5 * 2**30, named=None) -> None:
    """Write an HF model dir (config, safetensors shards + index, tokenizer) from an FSDP1/FSDP2/plain module.

    Collective: all ranks gather (one parameter at a time for FSDP2), rank 0 keeps CPU copies and writes.
    Without `tokenizer`, the tokenizer/generation files of the model's source directory are copied. `named`
    replaces the module's own `(hf_name, full tensor)` iterator (the engine's merged LoRA weights).
    """
    import copy

    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    from rlx.engine.weights import iter_full_params

    rank, _ = rank_world()
    sd = {}
    if named is None:
        named = iter_full_params(module, to_cpu=True, dtype=dtype)
    for name, t in named:
        if rank == 0:
            sd[name] = t.clone().contiguous()
    if rank == 0:
        hf, cls = _unwrap_hf(module)
        for name, buf in _persistent_buffers(hf):
            sd.setdefault(name, buf.detach().cpu().clone())
        tmp = out_dir.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        config = copy.deepcopy(hf.config)
        config.architectures = [cls.__name__]
        config.use_cache = True
        first = next((t for t in sd.values() if t.is_floating_point()), None)
        if first is not None:
            config.dtype = first.dtype
        config.save_pretrained(tmp)
        split = split_torch_state_dict_into_shards(sd, max_shard_size=max_shard_bytes)
        for fname, names in split.filename_to_tensors.items():
            save_file({n: sd[n] for n in names}, os.path.join(tmp, fname), metadata={"format": "pt"})
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            atomic_write(os.path.join(tmp, "model.safetensors.index.json"), json.dumps(index, indent=1))
        src = getattr(config, "_name_or_path", "") or ""
        if os.path.isdir(src):
            for fname in os.listdir(src):
                if fname == "generation_config.json" or (tokenizer is None and _is_tokenizer_file(fname)):
                    shutil.copy2(os.path.join(src, fname), os.path.join(tmp, fname))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _make_readable(tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    barrier()


def _make_readable(directory: str) -> None:
    """Give every file the mode a plain `open` would (0644 under the usual umask): safetensors writes 0600,
    and an export is meant to be read by other users and services (vLLM servers, evaluation jobs)."""
    umask = os.umask(0)
    os.umask(umask)
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            os.chmod(path, 0o666 & ~umask)


def _is_tokenizer_file(fname: str) -> bool:
    return fname.startswith("tokenizer") or fname in ("special_tokens_map.json", "vocab.json", "merges.txt",
                                                      "added_tokens.json", "chat_template.jinja",
                                                      "chat_template.json")
