"""Plain-Python building blocks for FSDP engines (no Ray): process group, model, FSDP wrapping,
gradient checkpointing, optimizer/scheduler, and parameter/optimizer CPU offload."""
from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from rlx.config.schema import FSDPConfig, OptimConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def init_distributed(device: str, rank: int | None = None, world_size: int | None = None,
                     master_addr: str | None = None, master_port: int | None = None,
                     timeout_s: float = 600) -> torch.device:
    """Join (or create) the default process group: nccl on CUDA, gloo on CPU. torchrun env vars work too.

    `timeout_s`: how long a collective (and the rendezvous) may wait for the other ranks before it fails
    (verl's `nccl_timeout`, 600 s by default)."""
    if master_addr is not None:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master_addr, str(master_port)
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
    return dev


def decoder_layer_classes(model: nn.Module) -> tuple[type, ...]:
    """The classes FSDP wraps one unit each: the HF model's _no_split_modules, found by name."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    assert classes, f"{type(model).__name__} declares no _no_split_modules found among its modules"
    return tuple(classes)


def build_hf_model(path: str, role: str, dtype: torch.dtype, override_config: dict | None = None,
                   trust_remote_code: bool = False, external_lib: str | None = None,
                   attn_implementation: str = "sdpa", meta: bool = False) -> PreTrainedModel:
    """Load an HF causal LM (actor/ref) or a token-classification model with one label (critic).

    `meta`: build the same model on the meta device from its config alone (no weights read, no memory): its
    parameters' names and shapes, for checks before any worker starts."""
    import importlib

    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from rlx.models import resolve_model_path
    from rlx.models.hf_compat import dtype_kwargs

    if external_lib:
        importlib.import_module(external_lib)
    path = resolve_model_path(path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for k, v in (override_config or {}).items():
        setattr(config, k, v)
    config.use_cache = False
    kwargs = dict(config=config, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation,
                  **dtype_kwargs(dtype))
    auto: type[AutoModelForCausalLM] | type[AutoModelForTokenClassification] = AutoModelForCausalLM
    if role == "critic":
        config.num_labels = 1
        config.classifier_dropout = 0.0
        auto = AutoModelForTokenClassification
    if meta:
        with torch.device("meta"):
            return auto.from_config(config, trust_remote_code=trust_remote_code)
    return auto.from_pretrained(path, **kwargs)


_MESHES: dict = {}  # (device type, world, fsdp_size) -> (the default group it was built on, its mesh)


def shard_mesh(fsdp_size: int, device: torch.device, key: str = "fsdp_config.fsdp_size"):
    """verl's `fsdp_size`: the ranks that shard one copy of the model. None (shard over the whole world) when it is
    negative (-1) or at least the world size, as in verl; else the 2-D `(replicate, shard)` device mesh of
    `world / fsdp_size` replicas of `fsdp_size` consecutive ranks each (hybrid sharding, HSDP): parameters are
    sharded inside a group and replicated across groups, gradients are reduce-scattered inside a group and
    all-reduced across groups, so every rank ends with the same averaged gradient as with one group.

    Collective (it creates the mesh's process groups): every rank calls it with the same size, in the same order."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    if fsdp_size < 0 or fsdp_size >= world:
        return None
    if fsdp_size == 0 or world % fsdp_size:
        raise ValueError(f"{key}={fsdp_size} must divide the world size {world}: the ranks split into replicas of "
                         f"{key} ranks each. Fix: {key} among the divisors of {world}, or {key}=-1 (shard over "
                         f"all ranks).")
    cache_key = (device.type, world, fsdp_size)
    built = _MESHES.get(cache_key)
    if built is None or built[0] is not dist.group.WORLD:  # a new default group (tests) needs new sub-groups
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))
        built = _MESHES[cache_key] = (dist.group.WORLD, mesh)
    return built[1]


def apply_gradient_checkpointing(model: PreTrainedModel) -> None:
    """HF non-reentrant checkpointing of every decoder layer (call before FSDP wrapping)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def apply_fsdp(model: nn.Module, strategy: str, fsdp_cfg: FSDPConfig, device: torch.device,
               key: str = "fsdp_config") -> nn.Module:
    """Shard each decoder layer and the root with FSDP1 (`fsdp`) or FSDP2 (`fsdp2`).

    `fsdp_size` (see `shard_mesh`): over the whole world, or hybrid: FSDP2 over the 2-D (replicate, shard) mesh,
    FSDP1 with HYBRID_SHARD (ZeRO-2's hybrid without reshard_after_forward) on the same mesh.
    `forward_prefetch`: FSDP1's own flag; with FSDP2 each decoder layer prefetches the next one's all-gather.
    `offload_policy` is FSDP2's CPUOffloadPolicy only (FSDP1 offloads with `param_offload`). `key` names the
    role's fsdp_config in errors."""
    if strategy == "fsdp" and fsdp_cfg.offload_policy:
        raise ValueError("fsdp_config.offload_policy=True is FSDP2's CPUOffloadPolicy; with strategy=fsdp use "
                         "fsdp_config.param_offload=True, or strategy=fsdp2")
    mp = fsdp_cfg.mixed_precision
    param_dtype = DTYPES[mp.get("param_dtype", "fp32")]
    reduce_dtype = DTYPES[mp.get("reduce_dtype", "fp32")]
    layer_classes = decoder_layer_classes(model)
    mesh = shard_mesh(fsdp_cfg.fsdp_size, device, f"{key}.fsdp_size")
    if strategy == "fsdp2":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        kwargs: dict[str, Any]
        kwargs = dict(mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
                      reshard_after_forward=fsdp_cfg.reshard_after_forward)
        if mesh is not None:
            kwargs["mesh"] = mesh
        if fsdp_cfg.offload_policy:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
        elif device.type == "cuda":
            model.to(device)
        layers = [m for m in model.modules() if isinstance(m, layer_classes)]
        sharded = [fully_shard(m, **kwargs) for m in layers]  # the same modules, now FSDPModules
        fully_shard(model, **kwargs)
        if fsdp_cfg.forward_prefetch:
            for layer, following in zip(sharded, sharded[1:]):
                layer.set_modules_to_forward_prefetch([following])
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        zero3 = fsdp_cfg.reshard_after_forward
        if mesh is None:
            sharding = ShardingStrategy.FULL_SHARD if zero3 else ShardingStrategy.SHARD_GRAD_OP
        else:
            sharding = ShardingStrategy.HYBRID_SHARD if zero3 else ShardingStrategy._HYBRID_SHARD_ZERO2
        return FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy(set(layer_classes)),
            mixed_precision=MixedPrecision(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                           buffer_dtype=DTYPES[mp.get("buffer_dtype", "fp32")]),
            sharding_strategy=sharding,
            device_mesh=mesh,
            device_id=device,
            forward_prefetch=fsdp_cfg.forward_prefetch,
            use_orig_params=True,
            sync_module_states=False,
        )
    raise ValueError(f"strategy={strategy!r}: rlx supports fsdp or fsdp2")


def restore_frozen_views(module: nn.Module) -> None:
    """FSDP1 unsharded (NO_SHARD: one rank) leaves a unit whose parameters are all frozen (with LoRA: the root's
    embedding, final norm and head) with its original parameters unregistered after a training backward: its
    post-backward hook never runs (nothing needs a gradient) and the catch-all reshard sees nothing to reshard, so
    they vanish from `named_parameters()` and `state_dict()`. Register them again (a no-op anywhere else)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not isinstance(module, FSDP):
        return
    for m in FSDP.fsdp_modules(module):
        h = m._handle
        if h is not None and h._use_orig_params and not h.uses_sharded_strategy and not h.flat_param.requires_grad:
            h._use_sharded_views()  # NO_SHARD: the original parameters as views of the (full) flat parameter


def clip_grad_norm(module: nn.Module, max_norm: float) -> torch.Tensor:
    """Global gradient norm (clipped in place) for FSDP1 or FSDP2 modules."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(module, FSDP):
        return module.clip_grad_norm_(max_norm)
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm


def build_optimizer(module: nn.Module, optim_cfg: OptimConfig, total_steps: int):
    """AdamW over the parameters that train (all of them, or LoRA's adapters) and a LambdaLR with linear warm-up
    then constant or cosine decay."""
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=optim_cfg.lr, betas=tuple(optim_cfg.betas),
                            weight_decay=optim_cfg.weight_decay)
    warmup = optim_cfg.lr_warmup_steps
    if warmup < 0:
        warmup = int(optim_cfg.lr_warmup_steps_ratio * total_steps)

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if optim_cfg.warmup_style == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            cos = 0.5 * (1.0 + math.cos(math.pi * 2.0 * optim_cfg.num_cycles * min(1.0, progress)))
            return optim_cfg.min_lr_ratio + (1 - optim_cfg.min_lr_ratio) * cos
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


# ---- parameter / optimizer CPU offload between phases (fsdp_config.param_offload / optimizer_offload) -----

def move_params(module: nn.Module, device: torch.device) -> None:
    """Move the sharded parameters of an FSDP1/FSDP2 module to `device` (between phases)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(module, FSDP):
        for m in FSDP.fsdp_modules(module):
            h = m._handle
            if h is None or h.flat_param.device == device:
                continue
            h.flat_param_to(device, non_blocking=True)  # also re-points the original params' views
            h.flat_param._local_shard = h.flat_param.data
    else:
        module.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and k != "step":
                state[k] = v.to(device, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
