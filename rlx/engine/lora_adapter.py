"""Start the policy's LoRA from a saved peft adapter (`actor_rollout_ref.model.lora_adapter_path`, verl's key).

The directory is peft's layout (what `PeftModel.save_pretrained` and rlx's `lora_adapter/` checkpoint export write):
`adapter_config.json` plus `adapter_model.safetensors` (or `adapter_model.bin`), the weights named
`base_model.model.<module>.lora_A.weight` / `.lora_B.weight`. As in verl, the adapter defines the LoRA: its rank
(`r`), `lora_alpha` and `target_modules` are used whatever `lora_rank` says (0 is fine); a `lora_rank > 0` or, with
it, a `lora_alpha` that disagrees with the file is an error rather than a silent choice between the two.

rlx merges adapters as `W + (alpha / r) B A` with one scaling for every module, so adapters that need more are
refused by name: DoRA, rsLoRA, per-module rank / alpha patterns, bias training, extra saved modules. The adapter's
`lora_dropout` is not used (rlx's adapters have none: the old, ref and updated log-probs are of one deterministic
policy); a note says so when the file has one.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

log = logging.getLogger("rlx")

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
PREFIX = "base_model.model."
# adapter_config.json entries rlx cannot honour, with the value that means "not used"
UNSUPPORTED = {
    "use_dora": (False, None), "use_rslora": (False, None), "rank_pattern": ({}, None), "alpha_pattern": ({}, None),
    "modules_to_save": (None, []), "bias": ("none",), "lora_bias": (False, None), "target_parameters": (None, []),
    "trainable_token_indices": (None,), "layer_replication": (None,), "layers_to_transform": (None,),
}


@dataclass
class SavedAdapter:
    """A peft adapter directory, read and checked."""

    path: str
    """The directory."""
    rank: int
    """Its r."""
    alpha: float
    """Its lora_alpha."""
    target_modules: Any
    """Its target_modules (a list of module names, or a regex / all-linear string)."""
    exclude_modules: Any
    """Its exclude_modules (null: none)."""
    weight_file: str
    """adapter_model.safetensors or adapter_model.bin inside `path`."""


def read_adapter(model_cfg, key: str = "actor_rollout_ref.model.lora_adapter_path") -> SavedAdapter:
    """Read and check the adapter directory `model_cfg.lora_adapter_path` (ValueError naming `key` when it is not a
    usable peft LoRA adapter, or disagrees with lora_rank / lora_alpha)."""
    raw = model_cfg.lora_adapter_path
    path = os.path.expanduser(str(raw))
    at = f"{key}={raw!r}"
    if not os.path.isdir(path):
        raise ValueError(f"{at} is not a directory; give a peft adapter directory ({CONFIG_FILE} + "
                         f"{WEIGHT_FILES[0]}), e.g. a checkpoint's lora_adapter/ folder")
    try:
        with open(os.path.join(path, CONFIG_FILE)) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{at}: {CONFIG_FILE} is missing or unreadable ({type(e).__name__}: {e}); a peft adapter "
                         f"directory has one (PeftModel.save_pretrained writes it)") from None
    weight = next((os.path.join(path, w) for w in WEIGHT_FILES if os.path.isfile(os.path.join(path, w))), None)
    if weight is None:
        raise ValueError(f"{at} has no adapter weights ({' or '.join(WEIGHT_FILES)})")
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"{at} is a {cfg.get('peft_type')} adapter; rlx starts only from LoRA adapters")
    bad = {k: cfg[k] for k, ok in UNSUPPORTED.items() if k in cfg and cfg[k] not in ok}
    if bad:
        raise ValueError(f"{at}: {CONFIG_FILE} sets {bad}, which rlx's LoRA does not support (it merges W + "
                         f"(lora_alpha / r) B A on the decoder layers' linear projections); use an adapter without "
                         f"them")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(rank, int) or rank <= 0 or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ValueError(f"{at}: {CONFIG_FILE} has r={rank!r}, lora_alpha={alpha!r}; both must be positive numbers")
    model_key = key.rsplit(".", 1)[0]
    if model_cfg.lora_rank > 0 and (model_cfg.lora_rank != rank or float(model_cfg.lora_alpha) != float(alpha)):
        raise ValueError(f"{model_key}.lora_rank={model_cfg.lora_rank}, lora_alpha={model_cfg.lora_alpha} disagree "
                         f"with the adapter at {at} (r={rank}, lora_alpha={alpha}), whose rank and alpha are used. "
                         f"Fix: {model_key}.lora_rank=0 (take the adapter's), or lora_rank={rank} lora_alpha={alpha}")
    if cfg.get("lora_dropout"):
        log.info("rlx: note: the adapter at %s has lora_dropout=%s; rlx trains it without dropout", raw,
                 cfg["lora_dropout"])
    target = cfg.get("target_modules")
    if isinstance(target, (list, tuple, set)):
        target = sorted(target)
    exclude = cfg.get("exclude_modules")
    if isinstance(exclude, (list, tuple, set)):
        exclude = sorted(exclude)
    if not target:
        raise ValueError(f"{at}: {CONFIG_FILE} has no target_modules")
    return SavedAdapter(path=path, rank=rank, alpha=float(alpha), target_modules=target, exclude_modules=exclude,
                        weight_file=weight)


def _read_weights(adapter: SavedAdapter) -> dict[str, torch.Tensor]:
    if adapter.weight_file.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(adapter.weight_file)
    return torch.load(adapter.weight_file, map_location="cpu", weights_only=True)


def load_adapter_weights(model: nn.Module, adapter: SavedAdapter, adapter_name: str = "default") -> None:
    """Copy the saved lora_A / lora_B into `model`'s injected adapters (peft's names plus `adapter_name`): every
    adapter of the model must be in the file with its shape, and the file must hold nothing else."""
    at = f"lora_adapter_path={adapter.path!r}"
    saved = _read_weights(adapter)
    params = dict(model.named_parameters())
    own = {n: p for n, p in params.items() if f".lora_A.{adapter_name}." in n or f".lora_B.{adapter_name}." in n}
    expected = {}
    for name in own:
        module, _, rest = name.partition(f".{adapter_name}.")  # x.lora_A.default.weight -> x.lora_A, weight
        expected[f"{PREFIX}{module}.{rest}"] = name
    extra = sorted(set(saved) - set(expected))
    missing = sorted(set(expected) - set(saved))
    if extra or missing:
        raise ValueError(f"{at}: its weights do not match the adapters built from its adapter_config.json on this "
                         f"model: {len(missing)} missing (e.g. {missing[:3]}), {len(extra)} unexpected (e.g. "
                         f"{extra[:3]}); was it saved from another model?")
    shapes = [(k, tuple(saved[k].shape), tuple(own[v].shape)) for k, v in expected.items()
              if saved[k].shape != own[v].shape]
    if shapes:
        raise ValueError(f"{at}: weight shapes do not fit the model (name, file, model): {shapes[:3]}; was it saved "
                         f"from another model?")
    with torch.no_grad():
        for k, v in expected.items():
            own[v].copy_(saved[k].to(own[v].dtype))
