"""What a model directory says, read before any worker starts: its config.json (layer and head counts, with the
model section's override_config), and its module names from a copy built on the meta device (no weights read, no
memory). Built-in models (builtin://...) are materialised on first use. The preflight calls these (validation does
no IO).
"""
from __future__ import annotations

import json
import os


def num_hidden_layers(model_path: str) -> int | None:
    """Layer count from the model's config.json (materialises a built-in model on first use)."""
    from rlx.models import resolve_model_path

    path = os.path.join(resolve_model_path(model_path), "config.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("num_hidden_layers")


def model_config(model) -> dict:
    """The model's config.json (materialises a built-in model on first use) with `override_config` applied."""
    from rlx.models import resolve_model_path

    path = os.path.join(resolve_model_path(model.path), "config.json")
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            out = json.load(f)
    return {**out, **(model.override_config or {})}


def model_module_names(model_path: str, trust_remote_code: bool = False) -> list[tuple[str, str]] | None:
    """`(name, class name)` of every module of the causal LM at `model_path`, built on the meta device (no weights
    read, no memory); None when the path has no config.json."""
    from rlx.models import resolve_model_path

    path = resolve_model_path(model_path)
    if not os.path.exists(os.path.join(path, "config.json")):
        return None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return [(n, type(m).__name__) for n, m in model.named_modules()]


def installed(package: str) -> bool:
    """The package can be imported here (its spec is found; nothing is imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False
