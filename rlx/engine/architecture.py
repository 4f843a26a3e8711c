"""What a model is, as a checkpoint records it: class, layer count, hidden and vocabulary sizes, the LoRA adapters,
and a hash of every parameter's name and shape.

`describe(model, lora)` is taken by the engine from the model it built (after LoRA, before anything wraps it) and
saved in each role's `meta.json`; `expected(model_cfg, role)` builds the model a run is about to train on the meta
device (its config, `override_config` and LoRA keys; no weights are read) and describes it the same way, so that the
driver can refuse a checkpoint of another model before any worker starts (`differences`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FIELDS = ("class", "num_hidden_layers", "hidden_size", "vocab_size", "lora")


def describe(model: PreTrainedModel, lora) -> dict:
    """The record of `model` (a plain HF model, LoRA applied) with its `LoraSpec` (or None)."""
    from rlx.engine.weights import clean_param_name

    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    shapes = sorted((clean_param_name(n), list(p.shape)) for n, p in model.named_parameters())
    return {"class": type(model).__name__,
            "num_hidden_layers": getattr(text, "num_hidden_layers", None),
            "hidden_size": getattr(text, "hidden_size", None),
            "vocab_size": getattr(text, "vocab_size", None),
            "lora": None if lora is None else {"rank": lora.rank, "alpha": float(lora.alpha),
                                               "modules": len(lora.modules)},
            "parameters": len(shapes),
            "params_sha256": hashlib.sha256(json.dumps(shapes).encode()).hexdigest()}


def expected(model_cfg, role: str) -> dict:
    """The record of the model `FSDPEngine` will build for `role` from `model_cfg`, built on the meta device."""
    return describe(*build_meta(model_cfg, role))


def build_meta(model_cfg, role: str):
    """(the model `FSDPEngine` will build for `role` from `model_cfg` on the meta device, LoRA applied; its
    `LoraSpec` or None). No weights are read."""
    from rlx.engine.fsdp import build_hf_model
    from rlx.engine.lora import apply_lora, lora_enabled

    scorer = role in ("critic", "reward")
    model = build_hf_model(model_cfg.path, "critic" if scorer else "actor", torch.float32,
                           override_config=model_cfg.override_config, trust_remote_code=model_cfg.trust_remote_code,
                           external_lib=model_cfg.external_lib, meta=True)
    lora = None
    if lora_enabled(model_cfg):
        if model_cfg.lora_adapter_path:  # the adapter's own rank, alpha and targets; its weights are not needed
            from rlx.engine.lora_adapter import read_adapter

            saved = read_adapter(model_cfg)
            model_cfg = dataclasses.replace(model_cfg, lora_rank=saved.rank, lora_alpha=saved.alpha,
                                            target_modules=saved.target_modules,
                                            exclude_modules=saved.exclude_modules, lora_adapter_path=None)
        lora = apply_lora(model, model_cfg)
    return model, lora


def differences(saved: dict, built: dict) -> list[str]:
    """`field: saved X, this run Y` for each field of the two records that differs; [] when they describe the same
    model. The parameter hash is only compared when every named field agrees (it then names what they cannot)."""
    out = [f"{k}: checkpoint {saved.get(k)!r}, this run {built.get(k)!r}" for k in FIELDS
           if saved.get(k) != built.get(k)]
    if not out and saved.get("params_sha256") != built.get("params_sha256"):
        out.append(f"parameter names/shapes: checkpoint {saved.get('parameters')} parameters (sha256 "
                   f"{str(saved.get('params_sha256'))[:12]}), this run {built.get('parameters')} (sha256 "
                   f"{str(built.get('params_sha256'))[:12]})")
    return out
