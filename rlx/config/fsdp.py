"""The FSDP engine's settings that every trained or scored model has (`fsdp_config`, `optim`, `checkpoint`), and
their rules: the strategies, hybrid sharding's fsdp_size, the mixed-precision keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.rules import built_roles, choice, get_key, world_size


STRATEGIES = ("fsdp", "fsdp2")
VERL_ENGINE_STRATEGIES = ("fsdp", "fsdp2", "fsdp_turbo")  # the values verl's FSDP engine config accepts
MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")
DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")


@dataclass
class FSDPConfig:
    param_offload: bool = False
    """Keep sharded parameters on the CPU between uses."""
    optimizer_offload: bool = False
    """Keep optimizer state on the CPU between updates, and in an update until its first optimizer step."""
    offload_policy: bool = False
    """FSDP2 only (strategy fsdp2; an error with fsdp): use CPUOffloadPolicy (parameters, gradients and optimizer
    step on the CPU)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3); False keeps them until backward (ZeRO-2)."""
    fsdp_size: int = -1
    """Ranks that shard one copy of the model (verl's FSDP group size). -1 (or any size >= the world size, as in
    verl): shard over all ranks. N that divides the world: hybrid sharding (HSDP), world/N replicas of N
    consecutive ranks; parameters sharded inside a replica, gradients averaged over all ranks, so training is
    the same as with -1, with more memory per rank and less traffic between replicas (e.g. N = GPUs per node)."""
    forward_prefetch: bool = False
    """Prefetch the next layer's all-gather during forward (FSDP1's forward_prefetch; FSDP2: each decoder layer
    prefetches the next one)."""
    wrap_policy: dict = field(default_factory=lambda: {"min_num_params": 0})
    """verl key; rlx wraps every decoder layer (the HF model's _no_split_modules) and the root, which is verl's
    min_num_params=0 (other policies are not supported yet)."""
    model_dtype: str = "fp32"
    """dtype of the sharded master weights: fp32 | bf16."""
    mixed_precision: dict = field(default_factory=dict)
    """FSDP compute dtypes {param_dtype, reduce_dtype, buffer_dtype}: fp32 | bf16 | fp16. Keys left unset get
    verl's defaults on cuda (param bf16, reduce fp32, buffer fp32) and fp32 on cpu."""
    use_orig_params: bool = False
    """verl key: FSDP1's flat-parameter bookkeeping. rlx's FSDP1 always keeps the original parameters (True): the
    same AdamW update of the same gradients as the flat view (False), up to floating-point summation order; see
    NO_OP_BY_DESIGN."""
    strategy: str = "fsdp"
    """verl key: fsdp | fsdp2 | fsdp_turbo. verl overwrites it with the role's own `strategy` (actor.strategy,
    ref.strategy, critic.strategy), which is what chooses FSDP1 or FSDP2, there and in rlx."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    lr_warmup_steps: int = -1
    """Warm-up steps; -1 uses lr_warmup_steps_ratio."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up as a fraction of the total training steps."""
    min_lr_ratio: float = 0.0
    """Cosine schedule floor as a fraction of lr."""
    num_cycles: float = 0.5
    """Cosine cycles."""
    warmup_style: str = choice("constant", ("constant", "cosine"))
    """Schedule after warm-up: constant | cosine."""
    total_training_steps: int = -1
    """verl key set by the program: the schedule runs over the run's training steps (trainer.total_training_steps,
    or total_epochs over the data); leave it at -1."""


@dataclass
class CheckpointContents:
    save_contents: list = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """What a checkpoint saves: model | optimizer | extra (lr scheduler, RNG) | hf_model (an HF-format export
    under huggingface/, loadable by from_pretrained and vLLM; with LoRA the merged model) | lora_adapter (with
    LoRA: the adapter alone under lora_adapter/, peft's layout). With LoRA, model holds the adapters only."""
    load_contents: list = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """What a resume loads."""


def check_strategies(cfg, errors):
    """The strategy of each role the job builds (a GRPO job has no critic, a job without a KL term no ref: their
    keys, which follow the actor's, are not theirs to fix)."""
    roles = [role for role, _ in built_roles(cfg)]
    for key in (f"{role}.strategy" for role in roles):
        value = get_key(cfg, key)
        if value not in STRATEGIES:
            errors.append(f"{key}={value!r} is not supported; rlx trains with fsdp or fsdp2. Fix: {key}=fsdp2.")
    fsdp_configs = {"actor_rollout_ref.actor": "actor_rollout_ref.actor.fsdp_config",
                    "actor_rollout_ref.ref": "actor_rollout_ref.ref.fsdp_config", "critic": "critic.model.fsdp_config"}
    for strategy_key, prefix in ((f"{role}.strategy", fsdp_configs[role]) for role in roles):
        engine_strategy = get_key(cfg, f"{prefix}.strategy")  # verl replaces it by the role's strategy: only checked
        if engine_strategy not in VERL_ENGINE_STRATEGIES:
            errors.append(f"{prefix}.strategy={engine_strategy!r} is not one of verl's {list(VERL_ENGINE_STRATEGIES)} "
                          f"(verl overwrites it with {strategy_key}, which picks FSDP1 or FSDP2). Fix: drop it, or "
                          f"set {strategy_key}.")
        if get_key(cfg, strategy_key) == "fsdp" and get_key(cfg, f"{prefix}.offload_policy"):
            errors.append(f"{prefix}.offload_policy=True is FSDP2's CPUOffloadPolicy, but {strategy_key}=fsdp. Fix: "
                          f"{strategy_key}=fsdp2, or {prefix}.param_offload=True (both strategies) instead.")


def check_fsdp_size(cfg, errors):
    """Hybrid sharding: `fsdp_size` ranks per replica must split the world evenly (verl's meaning; -1 or a size of
    at least the world shards over all ranks)."""
    ws = world_size(cfg)
    for role, _ in built_roles(cfg):
        key = f"{role}.fsdp_config.fsdp_size" if role != "critic" else "critic.model.fsdp_config.fsdp_size"
        n = get_key(cfg, key)
        if not isinstance(n, int) or isinstance(n, bool):
            errors.append(f"{key}={n!r} must be an integer: -1 (shard over all ranks) or a divisor of the world size. "
                          f"Fix: {key}=-1.")
        elif n == 0 or (0 < n < ws and ws % n):
            errors.append(f"{key}={n} must divide the world size {ws} (trainer.nnodes * trainer.n_gpus_per_node): "
                          f"the ranks split into replicas of {key} ranks that each shard the model (hybrid sharding). "
                          f"Fix: {key} among the divisors of {ws} (e.g. trainer.n_gpus_per_node), or {key}=-1.")


def check_mixed_precision(cfg, errors):
    """Each role's fsdp_config.mixed_precision: known keys, dtype names."""
    from rlx.config.device import fsdp_configs

    for prefix, fsdp_cfg in fsdp_configs(cfg).items():
        for k, v in (fsdp_cfg.mixed_precision or {}).items():
            if k not in MIXED_PRECISION_KEYS:
                errors.append(f"{prefix}.mixed_precision.{k} is not a mixed-precision key; choose one of "
                              f"{list(MIXED_PRECISION_KEYS)}. Fix: remove it.")
            elif v not in DTYPE_NAMES:
                errors.append(f"{prefix}.mixed_precision.{k}={v!r} is not valid; choose one of {list(DTYPE_NAMES)}. "
                              f"Fix: {prefix}.mixed_precision.{k}=bf16 (or fp32).")
