"""LoRA on the policy (verl's `model.lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules`), with peft.

`apply_lora(model, model_cfg)` runs on the plain HF model, before the token head, tiling and FSDP: peft's
`get_peft_model` replaces each targeted `nn.Linear` of the decoder layers by a `lora.Linear` (the frozen
`base_layer` plus `lora_A`/`lora_B`); the engine keeps the HF model itself (peft's wrapper object is not the
module FSDP wraps), so the rest of rlx sees an HF model whose projections compute `W x + s B A x` with
`s = lora_alpha / lora_rank`. Every parameter outside the adapters is frozen (requires_grad False): only the
adapters get gradients and optimizer state. A base loaded in bf16 keeps fp32 adapters (peft upcasts them), so the
adapters have fp32 master weights while the frozen base stays at half the bytes.

- The ref policy is the same module with the adapters switched off (`adapters_disabled`), as in verl.
- Rollout engines and the HF export get merged weights under the plain HF names (`merged_params`):
  `W + s B A` per targeted projection, computed one projection at a time from the gathered full parameters.
- `adapter_params` gives the adapter alone, in peft's file layout (`save_adapter`).

The targets are restricted to linear projections inside the decoder layers: the fused head reads the output
projection's weight directly, and the embedding is shared with it in tied models.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from peft import LoraConfig

ADAPTER = "default"  # peft's adapter name
INIT_SEED = 0  # seed of the adapters' initialisation (lora_B starts at zero, so the policy starts as the base)
_LORA_PARAM = re.compile(r"^(?P<mod>.*)\.lora_(?P<ab>[AB])\." + ADAPTER + r"\.weight$")
_BASE_PARAM = re.compile(r"^(?P<mod>.*)\.base_layer\.(?P<what>weight|bias)$")


@dataclass
class LoraSpec:
    """What the engine needs to know about the adapters it carries."""

    rank: int
    """lora_rank."""
    alpha: float
    """lora_alpha."""
    modules: list
    """HF names of the adapted projections (e.g. model.layers.0.self_attn.q_proj)."""
    peft_config: LoraConfig
    """The peft LoraConfig (written next to an adapter export)."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _targets(value):
    """verl's target_modules / exclude_modules: a string ('all-linear', a module name or a regex) or a list."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]


def _decoder_layer_prefixes(model: nn.Module) -> list[str]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [n + "." for n, m in model.named_modules() if type(m).__name__ in names]


def lora_enabled(model_cfg) -> bool:
    """LoRA is on with a rank, or with an adapter to start from (verl: the adapter's own rank)."""
    return model_cfg.lora_rank > 0 or bool(model_cfg.lora_adapter_path)


def apply_lora(model: nn.Module, model_cfg, key: str = "actor_rollout_ref.model") -> LoraSpec:
    """Inject LoRA adapters into `model` (an HF causal LM, before any wrapping) and freeze everything else; with
    `lora_adapter_path`, the adapters are the saved adapter's (its rank, alpha, targets and weights).

    Raises ValueError naming `key` when a listed module does not exist, when the targets match nothing, when
    they match a module outside the decoder layers' linear projections, or when the saved adapter does not fit."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    rank, alpha = model_cfg.lora_rank, model_cfg.lora_alpha
    target, exclude = _targets(model_cfg.target_modules), _targets(model_cfg.exclude_modules)
    adapter = None
    if model_cfg.lora_adapter_path:
        from rlx.engine.lora_adapter import read_adapter

        adapter = read_adapter(model_cfg, f"{key}.lora_adapter_path")
        rank, alpha, target, exclude = adapter.rank, adapter.alpha, adapter.target_modules, adapter.exclude_modules
    # where the targets come from, for the messages: the config's keys, or the adapter's file
    at = (f"{key}.lora_adapter_path={model_cfg.lora_adapter_path!r}: adapter_config.json " if adapter is not None
          else f"{key}.")
    names = [n for n, _ in model.named_modules()]
    for k, listed in (("target_modules", target), ("exclude_modules", exclude)):
        if isinstance(listed, list):
            missing = [t for t in listed if not any(n == t or n.endswith("." + t) for n in names)]
            if missing:
                linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
                raise ValueError(f"{at}{k}={listed}: {missing} name no module of {type(model).__name__}; its "
                                 f"linear modules are {linear} (or use target_modules=all-linear)")
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target, exclude_modules=exclude, lora_dropout=0.0,
                     bias="none", task_type="CAUSAL_LM")
    try:
        # lora_A's random init from a fixed seed: the same adapters on every rank (FSDP shards what each rank
        # built) and in every run, whatever used the global RNG before
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            get_peft_model(model, cfg, autocast_adapter_dtype=True)
    except ValueError as e:  # peft: "Target modules ... not found in the base model"
        raise ValueError(f"{at}target_modules={target!r} (exclude_modules={exclude!r}): {e}") from None
    layers = _decoder_layer_prefixes(model)
    adapted = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    outside = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)
               and (not isinstance(m.get_base_layer(), nn.Linear) or not any(n.startswith(p) for p in layers))]
    if outside:
        raise ValueError(f"{at}target_modules={target!r} matches {outside}: rlx puts LoRA on the decoder layers' "
                         f"linear projections only (the fused head reads the output projection's weight, tied to the "
                         f"embedding); list projections such as q_proj, v_proj, gate_proj, or use all-linear")
    if not adapted:
        raise ValueError(f"{at}target_modules={target!r} (exclude_modules={exclude!r}) matches no module")
    if adapter is not None:
        from rlx.engine.lora_adapter import load_adapter_weights

        load_adapter_weights(model, adapter)
    for n, p in model.named_parameters():
        p.requires_grad_(_LORA_PARAM.match(n) is not None)
    return LoraSpec(rank=rank, alpha=float(alpha), modules=adapted, peft_config=cfg)


@contextlib.contextmanager
def adapters_disabled(module: nn.Module):
    """Run `module` (plain or FSDP-wrapped) as its base model: every LoRA layer's adapter switched off (peft's
    `enable_adapters(False)`, what `PeftModel.disable_adapter()` does), switched back on at exit."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)


def merged_params(named: Iterable[tuple[str, torch.Tensor]], scaling: float) -> Iterator[tuple[str, torch.Tensor]]:
    """Plain HF `(name, tensor)` pairs from an engine's full parameters with adapters: each adapted projection's
    `base_layer.weight` is held until its `lora_A`/`lora_B` arrive (peft registers them right after it) and
    yielded as `weight + scaling * B @ A` (computed in float32, returned in the weight's dtype); its bias as
    `bias`; every other parameter unchanged. At most one projection is held at a time."""
    held: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in named:
        m = _BASE_PARAM.match(name)
        if m:
            mod, what = m["mod"], m["what"]
            if what == "bias":
                yield f"{mod}.bias", t
            else:
                held.setdefault(mod, {})["W"] = t
            continue
        m = _LORA_PARAM.match(name)
        if m:
            parts = held.setdefault(m["mod"], {})
            parts[m["ab"]] = t
            if len(parts) == 3:
                del held[m["mod"]]
                w = parts["W"]
                delta = torch.mm(parts["B"].to(w.device, torch.float32), parts["A"].to(w.device, torch.float32))
                yield f"{m['mod']}.weight", (w.float() + scaling * delta).to(w.dtype)
            continue
        yield name, t
    assert not held, f"adapted projections without their adapter weights: {sorted(held)}"


def adapter_params(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapters alone, named as in a peft adapter file (`base_model.model.<module>.lora_A.weight`)."""
    for name, t in named:
        m = _LORA_PARAM.match(name)
        if m:
            yield f"base_model.model.{m['mod']}.lora_{m['ab']}.weight", t


def save_adapter(spec: LoraSpec, tensors: dict, out_dir: str, base_model_path: Optional[str] = None) -> None:
    """Write a peft adapter directory (adapter_config.json + adapter_model.safetensors): loadable with
    `PeftModel.from_pretrained(base, out_dir)` and by vLLM's LoRA support."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    cfg = spec.peft_config.to_dict()
    cfg["base_model_name_or_path"] = base_model_path
    for k, v in list(cfg.items()):
        if isinstance(v, set):
            cfg[k] = sorted(v)
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=1, default=str)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "adapter_model.safetensors"),
              metadata={"format": "pt"})
