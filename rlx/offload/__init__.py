"""Layer-grouped activation offload for FSDP1/FSDP2-wrapped HF decoder models (see docs/offload.md).

    offloader = apply_activation_offload(fsdp_module, ActivationOffloadConfig(), enable_gradient_checkpointing=True)
    with offloader.activate():          # one micro-batch's forward + loss.backward()
        loss = ...; loss.backward()

Imports only torch (no ray/hydra/vllm), so benchmarks and GPU tests can use it under plain torchrun.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import nn

from rlx.config.offload import ActivationOffloadConfig

from .core import ActivationOffloader

__all__ = ["ActivationOffloadConfig", "ActivationOffloader", "apply_activation_offload", "find_decoder_layers"]

_KEY = "model.enable_activation_offload"


def _layer_class_names(module: nn.Module) -> set:
    names = set()
    for m in module.modules():
        nsm = getattr(m, "_no_split_modules", None)
        if nsm:
            names.update(nsm)
    return names


def _is_layer(m: nn.Module, names: set) -> bool:
    return any(c.__name__ in names for c in type(m).__mro__)


def find_decoder_layers(module: nn.Module) -> List[nn.Module]:
    """The decoder layers, in order, under any FSDP1 (FullyShardedDataParallel) or FSDP2 wrapping.

    Matched by class (or base class, since FSDP2 subclasses it) against the HF model's `_no_split_modules`;
    without those, the longest ModuleList whose items share one class. Nested matches are ignored.
    """
    names = _layer_class_names(module)
    layers: List[nn.Module] = []
    if names:
        inside: set = set()
        for m in module.modules():
            if id(m) in inside:
                continue
            if _is_layer(m, names):
                layers.append(m)
                inside.update(id(x) for x in m.modules())
    if layers:
        return layers
    best: List[nn.Module] = []
    for m in module.modules():
        if isinstance(m, nn.ModuleList) and len(m) > len(best):
            items = [_unwrap(x) for x in m]
            if len({type(x) for x in items}) == 1:
                best = items
    return best


def _unwrap(m: nn.Module) -> nn.Module:
    return getattr(m, "_fsdp_wrapped_module", m)


def _owners(module: nn.Module, layers: List[nn.Module]) -> List[List[nn.Module]]:
    """For each layer, the modules whose parameters it may use: itself and its nearest FSDP1 wrapper (which
    holds the flat parameter that the layer's weights are views of)."""
    parent = {}
    for m in module.modules():
        for c in m.children():
            parent[id(c)] = m
    out = []
    for layer in layers:
        own = [layer]
        p = parent.get(id(layer))
        while p is not None:
            if hasattr(p, "_fsdp_wrapped_module"):
                own.append(p)
                break
            p = parent.get(id(p))
        out.append(own)
    return out


def _head_modules(module: nn.Module, layers: List[nn.Module]) -> List[nn.Module]:
    """The final norm (if found) and the output projection of an HF causal LM, the projection last; empty if
    the output projection cannot be found."""
    inside = {id(x) for layer in layers for x in layer.modules()}
    for m in module.modules():
        if hasattr(m, "get_output_embeddings") and hasattr(m, "base_model"):
            # torch types a Module's attributes as Tensor | Module
            head = m.get_output_embeddings()  # type: ignore[operator]
            if not isinstance(head, nn.Module) or id(head) in inside:
                return []
            norm = getattr(getattr(m, "base_model", None), "norm", None)
            mods = [x for x in (norm, head) if isinstance(x, nn.Module)]
            return [x for x in mods if id(x) not in inside]
    return []


def _device_of(module: nn.Module) -> torch.device:
    for p in module.parameters():
        dev = p.device
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def apply_activation_offload(module: nn.Module, cfg: Optional[ActivationOffloadConfig] = None,
                             enable_gradient_checkpointing: bool = False,
                             recomputed: Sequence[nn.Module] = ()) -> ActivationOffloader:
    """Patch the decoder layers of `module` (HF model, plain or FSDP1/FSDP2 wrapped) for activation offload.

    Call once, after FSDP wrapping. With `enable_gradient_checkpointing`, each layer is checkpointed by the
    offloader (non-reentrant) so only its inputs are saved and offloaded; do not enable HF checkpointing too.
    `recomputed`: decoder layers that already save only their inputs and recompute themselves in backward
    (`rlx.ops.apply_tiled_layers`): never checkpointed again, their saved inputs are offloaded the same way.
    Outside `activate()` (or without grad) the layers run unchanged.
    """
    cfg = cfg or ActivationOffloadConfig()
    if (cfg.keep_last_layers is not None and cfg.keep_last_layers < 0) or cfg.min_tensor_bytes < 0:
        raise ValueError("ActivationOffloadConfig: keep_last_layers and min_tensor_bytes must be >= 0")
    layers = find_decoder_layers(module)
    if len(layers) < 3:
        raise ValueError(
            f"{_KEY}=True needs a model with at least 3 decoder layers (found {len(layers)}): the last group stays "
            f"on the device and the copy of one layer hides behind the next, so there is nothing to gain. "
            f"Set {_KEY}=False for this model.")
    names = _layer_class_names(module)
    cls = next((c.__name__ for c in type(layers[0]).__mro__ if c.__name__ in names), type(layers[0]).__name__)
    head = _head_modules(module, layers)  # offloaded as groups with offload_head; else only hooked
    own = {id(m) for m in recomputed}
    return ActivationOffloader(layers, _owners(module, layers), cfg, bool(enable_gradient_checkpointing),
                               _device_of(module), cls, head, _owners(module, head), root=module,
                               recomputed=[id(layer) in own for layer in layers])
