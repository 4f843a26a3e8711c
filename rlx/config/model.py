"""The policy's `actor_rollout_ref.model` section and its rules (the critic's model: rlx.config.critic):
LoRA, the fused head and tiling (long sequences), activation offload, Liger, Ulysses sequence parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlx.config.fsdp import STRATEGIES
from rlx.config.offload import ActivationOffloadConfig
from rlx.config.rules import built_roles, check_positive, choice, get_key, world_size


@dataclass
class FusedKernelOptions:
    impl_backend: str = choice("torch", ("torch", "triton"))
    """verl key: the fused head's implementation, torch | triton. torch: pure torch (CPU and GPU); triton: the same
    chunks and matmuls with Triton kernels for the softmax math (GPU, or CPU under TRITON_INTERPRET=1)."""
    chunk_size: int = 2048
    """Tokens per chunk of the fused head: its transient memory is about 3 x chunk_size x vocab x 4 bytes (torch
    backend; triton: one chunk_size x vocab tensor in the model's dtype)."""


@dataclass
class ModelConfig:
    path: str = "~/models/deepseek-llm-7b-chat"
    """HF model directory, hub-style id already on disk, or builtin://tiny-qwen2 (the default is verl's path:
    set it)."""
    custom_chat_template: Optional[str] = None
    """A Jinja chat template that replaces the tokenizer's: the dataset formats prompts with it and the HF export
    of a checkpoint carries it."""
    external_lib: Optional[str] = None
    """Module to import before building the model (registers custom architectures)."""
    override_config: dict = field(default_factory=dict)
    """HF config attributes to override, e.g. {attention_dropout: 0.0}."""
    enable_gradient_checkpointing: bool = True
    """Recompute each decoder layer in backward instead of saving its activations."""
    enable_activation_offload: bool = False
    """Offload saved activations to (pinned) CPU memory during update steps (strategy fsdp or fsdp2)."""
    activation_offload: ActivationOffloadConfig = field(default_factory=ActivationOffloadConfig)
    """Knobs of the activation offload (only read when enable_activation_offload is true)."""
    trust_remote_code: bool = False
    """Passed to the HF loaders (model, tokenizer, vLLM engine)."""
    use_remove_padding: bool = True
    """Run the actor and ref forward passes on the valid tokens only, packed into one row per micro-batch with
    position_ids restarting at each sequence; attention never crosses sequences (flash-attn varlen where it is
    installed on CUDA, else PyTorch SDPA per sequence)."""
    tile_mlp_tokens: int = 0
    """Run each decoder layer's MLP in tiles of this many tokens (0: off), so its intermediates for the whole
    sequence are never alive at once; in backward each tile is recomputed and differentiated on its own. Cuts
    the recompute working set of long sequences (best with activation offload + gradient checkpointing); costs
    one extra MLP forward per layer when training."""
    tile_layer_tokens: int = 0
    """Run the token-local parts of each decoder layer (RMSNorms with their float32 copies, q/k/v/o
    projections, rotary, residual adds, MLP) and the final norm in tiles of this many tokens (0: off); each layer
    saves only its input and recomputes itself in backward tile by tile, so only attention's q/k/v, output and
    log-sum-exp are ever whole (rlx.ops.tiled_layer). It is a tiled form of checkpointing: needs
    enable_gradient_checkpointing=True. Halves the update's memory per token of long sequences; off by default
    (below ~32k tokens a whole layer is faster). Exact: same outputs and input gradients as untiled."""
    use_shm: bool = False
    """Copy the model directory (config, weights, tokenizer) to shared memory (/dev/shm) once and load the actor,
    ref and rollout engine from there, as verl's copy_to_local(use_shm=True): faster loads of a model on a network
    or slow disk, at the cost of its size in host RAM. A copy already there is reused (see docs/rollout_memory.md)."""
    lora_rank: int = 0
    """LoRA rank of the policy's adapters (0: off, full fine-tuning). With a rank, peft puts LoRA adapters on the
    target_modules of every decoder layer, the base model is frozen (only the adapters get gradients and optimizer
    state; with actor.fsdp_config.model_dtype=bf16 the base stays bf16 and the adapters fp32), the ref policy is the
    same module with the adapters off (no second model), and rollouts / HF exports get merged weights."""
    lora_alpha: float = 16
    """LoRA scaling numerator: the adapters add (lora_alpha / lora_rank) * B A x (read only with lora_rank > 0)."""
    target_modules: Any = "all-linear"
    """Modules that get adapters (lora_rank > 0): all-linear (every linear projection of the decoder layers, verl's
    default), a list of module names such as [q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj], or a
    regex. Checked against the model's modules before the run starts; lm_head / embed_tokens are refused."""
    exclude_modules: Any = None
    """Modules to leave without adapters (lora_rank > 0): a list of module names, or a regex; null: none."""
    lora_adapter_path: Optional[str] = None
    """A saved peft LoRA adapter (a directory with adapter_config.json and adapter_model.safetensors or .bin, e.g. a
    checkpoint's lora_adapter/) to start the policy's adapters from, as verl: LoRA is on even with lora_rank 0, and
    the rank, alpha and target modules are the adapter's own (a lora_rank > 0 or lora_alpha that disagrees with the
    file is an error). null: new adapters (lora_B zero)."""
    use_liger: bool = False
    """Liger's Triton kernels (the liger-kernel package) for the RMSNorms, the SwiGLU MLP and the rotary embedding of
    the policy (actor and ref); its cross-entropy stays off (rlx's head computes the log-probs). GPU only (refused
    with trainer.device=cpu). See docs/kernels.md."""
    use_fused_kernels: bool = True
    """Fused log-prob head for the actor and the ref: hidden states -> output projection -> temperature ->
    log-prob (and entropy) in chunks of tokens, recomputed chunk by chunk in backward, never holding
    [tokens, vocab] logits. On by default in rlx (verl's default is off): the full logits cost ~1.8 MB per
    token on a 152k vocabulary and set the longest response that fits."""
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)
    """Options of the fused head."""


def _sp_roles(cfg):
    """(sp key, sp, model key prefix, model config) of each role that is built with sp > 1."""
    for role, model_prefix in built_roles(cfg):
        yield f"{role}.ulysses_sequence_parallel_size", get_key(cfg, f"{role}.ulysses_sequence_parallel_size"), \
            model_prefix, get_key(cfg, model_prefix)


def check_sequence_parallel(cfg, errors):
    """Ulysses: sp splits the world into groups, the attention heads among a group's ranks; needs packed rows."""
    ws = world_size(cfg)
    for key, sp, prefix, model in _sp_roles(cfg):
        if not isinstance(sp, int) or isinstance(sp, bool) or sp < 1:
            errors.append(f"{key}={sp!r} must be a positive integer (1 turns sequence parallelism off). Fix: {key}=1.")
            continue
        if sp == 1:
            continue
        if ws % sp:
            errors.append(f"{key}={sp} must divide the world size {ws} (trainer.nnodes * trainer.n_gpus_per_node): "
                          f"the ranks split into data-parallel groups of {sp}. Fix: {key} among the divisors of "
                          f"{ws}, or change trainer.n_gpus_per_node.")
        if not model.use_remove_padding:
            errors.append(f"{key}={sp} shards the packed (remove-padding) sequence and needs "
                          f"{prefix}.use_remove_padding=True (as in verl). Fix: {prefix}.use_remove_padding=True, "
                          f"or {key}=1.")
        # the model's head counts (its config.json): rlx.trainer.probes


def sp_heads_problem(key: str, sp: int, heads: int, kv_heads: int | None, where: str) -> str | None:
    """Why `sp` cannot split a model's attention (`where`: which model), or None: sp must divide the attention
    heads, and the KV heads split over the ranks or repeat evenly into them. Checked from config.json before Ray
    starts and again by the engine on the model it built."""
    kv = kv_heads or heads
    if heads % sp:
        return (f"{key}={sp} must divide the model's num_attention_heads={heads} ({where}): each rank attends with "
                f"heads/sp of them. Fix: {key} among the divisors of {heads}.")
    if kv % sp and sp % kv:
        return (f"{key}={sp} and the model's num_key_value_heads={kv} ({where}): one must divide the other (KV heads "
                f"are split over the ranks, or repeated when fewer than {key}). Fix: {key} that divides {kv} or is a "
                f"multiple of it.")
    return None


def check_kernels(cfg, errors):
    """Liger's Triton kernels need a GPU and the liger-kernel package."""
    for role, prefix in built_roles(cfg):
        if role == "actor_rollout_ref.ref":
            continue  # the policy's model key: said once for the actor
        key = f"{prefix}.use_liger"
        if not get_key(cfg, key):
            continue
        if cfg.trainer.device == "cpu":
            errors.append(f"{key}=True runs Liger's Triton kernels, which need a GPU, but trainer.device=cpu. "
                          f"Fix: {key}=False, or trainer.device=cuda.")
        # the liger-kernel package: rlx.trainer.probes


def check_offload(cfg, errors):
    for role, model, strategy_key in (
        ("actor", cfg.actor_rollout_ref.model, "actor_rollout_ref.actor.strategy"),
        ("critic", cfg.critic.model, "critic.strategy"),
    ):
        if not model.enable_activation_offload:
            continue
        prefix = "actor_rollout_ref.model" if role == "actor" else "critic.model"
        strategy = get_key(cfg, strategy_key)
        if strategy not in STRATEGIES:
            errors.append(f"{prefix}.enable_activation_offload=True requires {strategy_key} to be fsdp or fsdp2, "
                          f"got {strategy_key}={strategy!r}. Fix: set {strategy_key}=fsdp2, or "
                          f"{prefix}.enable_activation_offload=False.")
            continue
        # the model's layer count (its config.json): rlx.trainer.probes


def check_long_sequences(cfg, errors):
    """The fused head's chunk and the MLP tile sizes."""
    model = cfg.actor_rollout_ref.model
    if model.use_fused_kernels:
        check_positive(errors, "actor_rollout_ref.model.fused_kernel_options.chunk_size",
                  model.fused_kernel_options.chunk_size, "(tokens per chunk of the fused head)")
    # fused_kernel_options.impl_backend is a declared choice; triton's package and device: rlx.trainer.probes
    for role in ("actor", "ref"):  # the unfused head's chunked entropy
        if get_key(cfg, f"actor_rollout_ref.{role}.entropy_from_logits_with_chunking"):
            key = f"actor_rollout_ref.{role}.entropy_from_logits_chunk_size"
            check_positive(errors, key, get_key(cfg, key), "(rows per chunk of the entropy)")
    for prefix in ("actor_rollout_ref.model", "critic.model"):
        tile = get_key(cfg, f"{prefix}.tile_mlp_tokens")
        if tile < 0:
            errors.append(f"{prefix}.tile_mlp_tokens={tile} must be >= 0 (0 turns MLP tiling off). Fix: "
                          f"{prefix}.tile_mlp_tokens=0.")
        elif tile and get_key(cfg, f"{prefix}.activation_offload.recompute_mlp"):
            errors.append(f"{prefix}.tile_mlp_tokens={tile} and {prefix}.activation_offload.recompute_mlp=True both "
                          f"replace the MLP's forward (tiling also recomputes the MLP in backward). Fix: "
                          f"{prefix}.activation_offload.recompute_mlp=False, or {prefix}.tile_mlp_tokens=0.")
        layer = get_key(cfg, f"{prefix}.tile_layer_tokens")
        if layer < 0:
            errors.append(f"{prefix}.tile_layer_tokens={layer} must be >= 0 (0 turns layer tiling off). Fix: "
                          f"{prefix}.tile_layer_tokens=0.")
        elif layer and not get_key(cfg, f"{prefix}.enable_gradient_checkpointing"):
            errors.append(f"{prefix}.tile_layer_tokens={layer} recomputes each decoder layer in backward (a tiled "
                          f"form of checkpointing). Fix: {prefix}.enable_gradient_checkpointing=True, or "
                          f"{prefix}.tile_layer_tokens=0.")


def check_lora(cfg, errors):
    """verl's LoRA keys: rank, alpha, and module names that exist in the model (checked on a meta-device copy)."""
    if cfg.critic.model.lora_rank != 0:
        errors.append(f"critic.model.lora_rank={cfg.critic.model.lora_rank!r}: the critic trains in full in rlx (its "
                      f"value head is newly initialised and must train whole). Fix: critic.model.lora_rank=0; LoRA on "
                      f"the actor (actor_rollout_ref.model.lora_rank) works with a fully trained critic.")
    key = "actor_rollout_ref.model"
    model = cfg.actor_rollout_ref.model
    rank = model.lora_rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        errors.append(f"{key}.lora_rank={rank!r} must be an integer >= 0 (0 turns LoRA off). Fix: {key}.lora_rank=0, "
                      f"or a rank such as 32.")
        return
    if model.lora_adapter_path is not None and not isinstance(model.lora_adapter_path, str):
        errors.append(f"{key}.lora_adapter_path={model.lora_adapter_path!r} must be the path of a peft adapter "
                      f"directory (or null). Fix: {key}.lora_adapter_path=<adapter dir>.")
    if rank == 0 and model.lora_adapter_path:  # the adapter's rank, alpha and targets (checked by the preflight)
        check_lora_dtype(cfg, key, "lora_adapter_path", errors)
        return
    if rank == 0:
        return
    if not isinstance(model.lora_alpha, (int, float)) or isinstance(model.lora_alpha, bool) or model.lora_alpha <= 0:
        errors.append(f"{key}.lora_alpha={model.lora_alpha!r} must be a positive number (the adapters are scaled "
                      f"by lora_alpha / lora_rank). Fix: {key}.lora_alpha={2 * rank}.")
    lists = {}
    for k in ("target_modules", "exclude_modules"):
        v = get_key(model, k)
        if v is None and k == "exclude_modules":
            continue
        if isinstance(v, str):
            if not v:
                errors.append(f"{key}.{k}='' names no module. Fix: {key}.{k}=all-linear, or a list such as "
                              f"[q_proj,v_proj].")
            continue
        if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, str) and x for x in v):
            errors.append(f"{key}.{k}={v!r} must be all-linear, a module name / regex, or a non-empty list of module "
                          f"names. Fix: {key}.{k}=all-linear, or a list such as [q_proj,k_proj,v_proj,o_proj].")
            continue
        lists[k] = list(v)
    for k in ("lm_head", "embed_tokens"):
        if k in lists.get("target_modules", []):
            errors.append(f"{key}.target_modules contains {k}: rlx puts LoRA on the decoder layers' linear projections "
                          f"only (the fused head reads the output projection's weight, tied to the embedding). "
                          f"Fix: remove {k} from {key}.target_modules.")
    # the module names of the model (built on the meta device): rlx.trainer.probes
    check_lora_dtype(cfg, key, f"lora_rank={rank}", errors)


def check_lora_dtype(cfg, key, what, errors):
    strategy = cfg.actor_rollout_ref.actor.strategy
    if strategy == "fsdp" and cfg.actor_rollout_ref.actor.fsdp_config.model_dtype not in ("fp32", "float32"):
        errors.append(f"{key}.{what} with actor.strategy=fsdp and actor.fsdp_config.model_dtype="
                      f"{cfg.actor_rollout_ref.actor.fsdp_config.model_dtype}: FSDP1 flattens a layer's frozen base "
                      f"and its fp32 adapters into one buffer of one dtype. Fix: actor.strategy=fsdp2 (a bf16 base "
                      f"with fp32 adapters), or actor.fsdp_config.model_dtype=fp32.")
