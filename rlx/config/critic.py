"""`critic`: the value model GAE trains (algorithm.adv_estimator=gae).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlx.config.fsdp import CheckpointContents, FSDPConfig, OptimConfig
from rlx.config.offload import ActivationOffloadConfig
from rlx.config.profiler import RoleProfilerConfig
from rlx.config.rules import choice, critic_built


@dataclass
class CriticModelConfig:
    path: str = "${actor_rollout_ref.model.path}"
    """Critic base model (a value head replaces the LM head)."""
    tokenizer_path: str = "${actor_rollout_ref.model.path}"
    """Tokenizer of the critic. The critic reads the actor's token ids, so this tokenizer must have the same
    vocabulary as the actor's (data.tokenizer or actor_rollout_ref.model.path): checked before the run starts."""
    override_config: dict = field(default_factory=dict)
    """HF config attributes to override."""
    external_lib: Optional[str] = None
    """Module imported before building the model."""
    enable_gradient_checkpointing: bool = True
    """Recompute decoder layers in backward."""
    enable_activation_offload: bool = False
    """Offload saved activations to CPU memory during critic updates (strategy fsdp or fsdp2)."""
    activation_offload: ActivationOffloadConfig = field(default_factory=ActivationOffloadConfig)
    """Knobs of the activation offload."""
    trust_remote_code: bool = False
    """Passed to the HF loaders."""
    use_remove_padding: bool = True
    """Run the critic's forward passes on the valid tokens only, packed (see actor_rollout_ref.model)."""
    tile_mlp_tokens: int = 0
    """Run each decoder layer's MLP in tiles of this many tokens (0: off); see actor_rollout_ref.model."""
    tile_layer_tokens: int = 0
    """Run the token-local parts of each decoder layer in tiles of this many tokens (0: off; needs
    enable_gradient_checkpointing=True); see actor_rollout_ref.model."""
    use_liger: bool = False
    """Liger's Triton kernels for the critic's RMSNorms, SwiGLU MLP and rotary embedding (GPU only); see
    actor_rollout_ref.model.use_liger."""
    use_shm: bool = False
    """Copy the critic's model directory to shared memory (/dev/shm) once and load it from there (see
    actor_rollout_ref.model.use_shm)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP settings of the critic."""
    lora_rank: int = 0
    """verl key, refused (only 0): the critic trains in full. Its value head is newly initialised and must be
    trained whole, and the critic gains little from LoRA where the policy's frozen base is what saves memory; LoRA
    on the actor (actor_rollout_ref.model.lora_rank) composes with a fully trained critic."""
    lora_alpha: int = 16
    """verl key (inert: critic.model.lora_rank is refused, as verl ignores it without a rank)."""
    target_modules: Any = "all-linear"
    """verl key (inert: critic.model.lora_rank is refused, as verl ignores it without a rank)."""
    lora_adapter_path: Optional[str] = None
    """verl key, refused (only null): a saved adapter would put LoRA on the critic, which trains in full in rlx (see
    lora_rank)."""


@dataclass
class CriticConfig:
    rollout_n: int = "${actor_rollout_ref.rollout.n}"  # type: ignore[assignment]
    """Follows actor_rollout_ref.rollout.n."""
    strategy: str = "${actor_rollout_ref.actor.strategy}"
    """Training backend of the critic: fsdp | fsdp2."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Critic optimizer."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    ppo_mini_batch_size: int = "${actor_rollout_ref.actor.ppo_mini_batch_size}"  # type: ignore[assignment]
    """Prompts per critic optimizer step (multiplied by rollout.n)."""
    ppo_micro_batch_size: Optional[int] = None
    """verl key (deprecated): a global micro-batch; taken as verl takes it, ppo_micro_batch_size_per_gpu = this //
    (world size // critic.ulysses_sequence_parallel_size), with a note. Use ppo_micro_batch_size_per_gpu."""
    ppo_micro_batch_size_per_gpu: Optional[int] = "${actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}"  # type: ignore[assignment]
    """Sequences per critic forward/backward on each rank."""
    forward_micro_batch_size: Optional[int] = None
    """verl key (deprecated): a global micro-batch; forward_micro_batch_size_per_gpu = this // (world size //
    critic.ulysses_sequence_parallel_size), with a note (null: follows ppo_micro_batch_size, as in verl). Use
    forward_micro_batch_size_per_gpu."""
    forward_micro_batch_size_per_gpu: Optional[int] = "${critic.ppo_micro_batch_size_per_gpu}"  # type: ignore[assignment]
    """Sequences per value forward on each rank."""
    use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    """Form the critic's micro-batches (update and values) by token budgets instead of row counts (follows
    actor.use_dynamic_bsz)."""
    ppo_max_token_len_per_gpu: int = 32768
    """Token budget of one critic update micro-batch with use_dynamic_bsz."""
    forward_max_token_len_per_gpu: int = "${critic.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    """Token budget of one value-forward micro-batch with use_dynamic_bsz (follows ppo_max_token_len_per_gpu)."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism of the critic (as actor_rollout_ref.actor.ulysses_sequence_parallel_size; needs
    critic.model.use_remove_padding=True). 1: off."""
    ppo_epochs: int = "${actor_rollout_ref.actor.ppo_epochs}"  # type: ignore[assignment]
    """Passes over each batch."""
    shuffle: bool = "${actor_rollout_ref.actor.shuffle}"  # type: ignore[assignment]
    """Shuffle mini-batches."""
    grad_clip: float = 1.0
    """Max gradient norm."""
    cliprange_value: float = 0.5
    """Value clip range."""
    loss_agg_mode: str = choice("${actor_rollout_ref.actor.loss_agg_mode}", "rlx.algos.core_algos:LOSS_AGG_MODES",
                                when=critic_built)
    """Aggregation of the value loss (actor.loss_agg_mode's choices)."""
    loss_scale_factor: Optional[int] = "${actor_rollout_ref.actor.loss_scale_factor}"  # type: ignore[assignment]
    """The divisor of seq-mean-token-sum-norm for the value loss (follows actor.loss_scale_factor)."""
    checkpoint: CheckpointContents = field(default_factory=CheckpointContents)
    """Checkpoint contents."""
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    """Profiler of the critic worker."""
