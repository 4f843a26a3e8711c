"""The full (unsharded), HF-named weights of an engine's module, one parameter at a time: what a rollout engine
is synced from, what the HF export and the checkpoint code write.

`iter_full_params(module)` handles the three ways the actor may be held:

* FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters are DTensors; each one is gathered with
  `.full_tensor()` in turn, so only one full parameter is materialised at a time.
* FSDP1 (`FullyShardedDataParallel`): the root is unsharded with `summon_full_params(writeback=False)`
  (all ranks receive the full weights) and the FSDP/activation-checkpoint wrapper prefixes are stripped.
* a plain module (also DDP): parameters are yielded as they are.

`layered=True` (verl's `rollout.layered_summon`) bounds what is unsharded at once by one FSDP unit: FSDP1 summons
each unit (each decoder layer, then the root's own embedding / norm / head) alone, with `recurse=False`, and
yields its parameters before the next one is summoned, instead of summoning the whole model; FSDP2 already gathers
one parameter at a time in the units' order, so it is the same walk either way. The yielded names and values are
the same as without `layered` (the order differs for FSDP1: the root's own parameters come first).

Gathering is collective: EVERY rank of the FSDP group must exhaust the iterator, in the same order, even a
rank that throws the tensors away. FSDP1/FSDP2 tensors are fresh copies the consumer may keep; for a plain
module they are the live parameters (detached), so copy them before changing the module.
"""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn as nn

# prefixes that wrappers add to parameter names, to be removed to get the HF names
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "_offload_wrapped_module.")


def clean_param_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _is_fsdp1(module: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:  # pragma: no cover
        return False
    return isinstance(module, FSDP) or any(isinstance(m, FSDP) for m in module.modules())


def _dtensor_cls():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - older torch
        from torch.distributed._tensor import DTensor
    return DTensor


def _gather_device(local: torch.Tensor) -> torch.device | None:
    """NCCL cannot gather a CPU-offloaded shard: move it to the current CUDA device first."""
    import torch.distributed as dist
    if local.device.type != "cpu" or not torch.cuda.is_available() or not dist.is_initialized():
        return None
    if dist.get_backend() in ("nccl", "cuda:nccl"):
        return torch.device("cuda", torch.cuda.current_device())
    return None


def iter_full_params(module: nn.Module, *, to_cpu: bool = False, dtype: torch.dtype | None = None,
                     layered: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(hf_name, full_tensor)` for every parameter of `module` (an FSDP1/FSDP2/plain model).

    `to_cpu` moves each yielded tensor to CPU, `dtype` casts it (e.g. to the rollout dtype, halving the
    transfer for a bf16 engine), `layered` unshards one FSDP unit at a time (see the module docstring). Run it on
    every rank: the gathers are collectives.
    """
    if isinstance(module, nn.parallel.DistributedDataParallel):
        module = module.module

    def _post(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if dtype is not None and t.dtype != dtype and t.is_floating_point():
            t = t.to(dtype)
        if to_cpu and t.device.type != "cpu":
            t = t.cpu()
        return t

    if _is_fsdp1(module) and layered:
        yield from _fsdp1_by_unit(module, _post)
        return
    if _is_fsdp1(module):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        # FSDP1's `summon_full_params` needs the root FSDP instance; a model whose root is not wrapped
        # contains several roots, each summoned with the rest of the model.
        # the unsharded parameters are views into flat buffers freed when the context exits: clone each one so
        # a consumer that keeps the tensors (e.g. `dict(iter_full_params(m))`) never reads freed memory
        with FSDP.summon_full_params(module, writeback=False, recurse=True):
            for name, param in module.named_parameters():
                t = _post(param)
                yield clean_param_name(name), (t.clone() if t.data_ptr() == param.data_ptr() else t)
        return

    DTensor = _dtensor_cls()
    for name, param in module.named_parameters():
        if isinstance(param, DTensor):
            local = param.to_local()
            device = _gather_device(local)
            if device is not None:
                param = DTensor.from_local(local.to(device, non_blocking=True), param.device_mesh,
                                           param.placements, run_check=False, shape=param.shape,
                                           stride=param.stride())
            full = param.full_tensor()
        else:
            full = param.data
        yield clean_param_name(name), _post(full)


def _fsdp1_by_unit(module: nn.Module, post) -> Iterator[tuple[str, torch.Tensor]]:
    """FSDP1, one unit at a time: each FSDP instance is summoned alone (`recurse=False`: only its own flat
    parameter is all-gathered) and its own parameters (not those of units nested in it) are yielded, cloned, before
    the context frees them; parameters outside every unit are yielded as they are."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = [(n, m) for n, m in module.named_modules() if isinstance(m, FSDP)]
    unit_names = [n for n, _ in units]

    def owner(name: str) -> str | None:  # the innermost unit a parameter of `module` belongs to
        best = None
        for n in unit_names:
            if n == "" or name.startswith(n + "."):
                best = n if best is None or len(n) > len(best) else best
        return best

    for name, param in module.named_parameters():  # parameters no unit holds (a root that is not wrapped)
        if owner(name) is None:
            yield clean_param_name(name), post(param)
    seen: set[str] = set()
    for prefix, unit in units:
        # FSDP1's named_parameters strips its wrapper prefixes inside a summon: compare clean names
        nested = [clean_param_name(n) for n, m in unit.named_modules() if n and isinstance(m, FSDP)]
        with FSDP.summon_full_params(unit, writeback=False, recurse=False):
            for name, param in unit.named_parameters():
                name = clean_param_name(name)
                if name.endswith("_flat_param") or any(name.startswith(n + ".") for n in nested):
                    continue
                hf = clean_param_name(f"{prefix}.{name}" if prefix else name)
                if hf in seen:  # a parameter shared by two units (tied weights) goes once
                    continue
                seen.add(hf)
                t = post(param)
                yield hf, (t.clone() if t.data_ptr() == param.data_ptr() else t)
