"""`actor_rollout_ref.actor` and `actor_rollout_ref.ref`: the policy's training and the reference policy, and the
policy loss's rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlx.config.fsdp import CheckpointContents, FSDPConfig, OptimConfig
from rlx.config.profiler import RoleProfilerConfig
from rlx.config.rules import choice


@dataclass
class PolicyLossConfig:
    loss_mode: str = choice("vanilla", "rlx.algos.policy_losses:LOSS_MODES")
    """Policy loss (verl's names; docs/algorithms.md): vanilla (PPO clip, dual clip) | gspo (sequence ratio) |
    sapo (soft gate, actor.tau_pos/tau_neg) | gpg (REINFORCE) | clip_cov | kl_cov | geo_mean (GMPO) | dro (needs
    dro_beta) | cispo (clipped, detached IS weight) | dppo_tv | dppo_kl (divergence masks; clip_ratio_* are the
    divergence bounds, clip_ratio_c the IS truncation)."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of the valid tokens whose gradient is dropped (among those in the covariance band)."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance band."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of the covariance band."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: fraction of the valid tokens (largest covariance) that get the |log ratio| penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: coefficient of that |log ratio| penalty."""
    dro_beta: Optional[float] = None
    """dro: coefficient of the quadratic log-ratio penalty (required, > 0, with loss_mode=dro)."""


@dataclass
class ActorConfig:
    strategy: str = "fsdp2"
    """Training backend: fsdp (FSDP1) | fsdp2 (fully_shard)."""
    ppo_mini_batch_size: int = 256
    """Prompts per optimizer step (multiplied by rollout.n), before dividing across ranks."""
    ppo_micro_batch_size: Optional[int] = None
    """verl key (deprecated): a micro-batch over the whole data-parallel world; taken as verl takes it,
    ppo_micro_batch_size_per_gpu = this // (world size // ulysses_sequence_parallel_size), with a note. Use
    ppo_micro_batch_size_per_gpu."""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per forward/backward on each rank (gradient accumulation inside a mini-batch); required unless
    use_dynamic_bsz (verl has no default either)."""
    use_dynamic_bsz: bool = False
    """Form micro-batches by a token budget (ppo_max_token_len_per_gpu) instead of a row count, balanced across
    them; gradients are accumulated exactly whatever the split."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one update micro-batch with use_dynamic_bsz (a longer sequence gets one of its own)."""
    grad_clip: float = 1.0
    """Max global gradient norm."""
    clip_ratio: float = 0.2
    """PPO clip range: the lower and upper one where clip_ratio_low / clip_ratio_high are null (both default to 0.2,
    as in verl, so clip_ratio alone changes nothing there either)."""
    clip_ratio_low: Optional[float] = 0.2
    """Lower clip range (null: clip_ratio)."""
    clip_ratio_high: Optional[float] = 0.2
    """Upper clip range (clip-higher; null: clip_ratio)."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant for negative advantages (> 1)."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy loss settings."""
    loss_agg_mode: str = choice("token-mean", "rlx.algos.core_algos:LOSS_AGG_MODES")
    """token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm (Dr. GRPO: token
    sums over a constant, loss_scale_factor). The seq-mean-* modes divide by every row of the mini-batch, a fully
    masked row included (verl's)."""
    loss_scale_factor: Optional[int] = None
    """The constant divisor of seq-mean-token-sum-norm (null: data.max_response_length, the padded response length);
    the critic's follows it."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient."""
    freeze_vision_tower: bool = False
    """Do not train the vision encoder of a vision-language policy (its `visual` / `vision_tower` module), as verl:
    its parameters stop requiring gradients after the model (and LoRA) is built. A model without one trains whole,
    with one note (rlx.engine.vision)."""
    use_prefix_grouper: bool = False
    """verl key, refused (only False): verl's PrefixGrouper forwards the prompt shared by a group's n responses
    once; see NOT_SUPPORTED_REASONS."""
    tau_pos: float = 1.0
    """SAPO (policy_loss.loss_mode=sapo): gate temperature of tokens with a positive advantage."""
    tau_neg: float = 1.05
    """SAPO: gate temperature of tokens with a non-positive advantage."""
    calculate_sum_pi_squared: bool = False
    """Compute sum_v pi_v^2 per response token with the old log-probs (what optimal_token_baseline reads; required
    by algorithm.adv_estimator=optimal_token_baseline | tir_optimal_token_baseline)."""
    use_kl_loss: bool = False
    """Add a KL(actor || ref) loss term (GRPO style)."""
    kl_loss_coef: float = 0.001
    """Coefficient of the KL loss."""
    kl_loss_type: str = choice("low_var_kl", "rlx.algos.core_algos:KL_PENALTY_TYPES")
    """KL estimator of the loss: kl(k1) | abs | mse(k2) | low_var_kl(k3), or one of them with a + (k1+, k3+, ...):
    the estimator's value with k2's gradient (straight through)."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    shuffle: bool = False
    """Shuffle mini-batches between PPO epochs."""
    data_loader_seed: Optional[int] = 42
    """Seed of that shuffle (null: 0)."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism of the actor (verl's): groups of this many ranks share each micro-batch, each
    rank holds 1/sp of its packed sequence and attends with 1/sp of the heads (all-to-all around attention).
    Needs actor_rollout_ref.model.use_remove_padding=True; must divide the world size and the model's attention
    heads. Token budgets (ppo_max_token_len_per_gpu, log_prob_max_token_len_per_gpu) are per GPU: a group's
    micro-batch holds up to budget x sp tokens. 1: off."""
    use_torch_compile: bool = True
    """verl key; rlx never compiles (a no-op by design: compiling changes speed, not results)."""
    entropy_from_logits_with_chunking: bool = False
    """Unfused head (model.use_fused_kernels=False): compute the entropy from the logits in chunks of
    entropy_from_logits_chunk_size tokens (float32 per chunk; rlx's unfused entropy otherwise runs 1024 rows at a
    time), so the float32 softmax of the whole [tokens, vocab] logits is never held at once; same values and
    gradients. The fused head always computes it chunk by chunk (fused_kernel_options.chunk_size) and ignores it."""
    entropy_from_logits_chunk_size: int = 2048
    """Tokens per chunk of entropy_from_logits_with_chunking."""
    entropy_checkpointing: bool = False
    """Unfused head (model.use_fused_kernels=False): recompute the entropy from the logits in backward (activation
    checkpointing of the entropy) instead of keeping its [tokens, vocab] intermediates; same values and
    gradients. The fused head already recomputes each chunk's logits, softmax and entropy in backward and keeps
    none of them, so it ignores this key."""
    checkpoint: CheckpointContents = field(default_factory=lambda: CheckpointContents(
        save_contents=["model", "optimizer", "extra", "hf_model"]))
    """Checkpoint contents (rlx's actor default adds hf_model to verl's: an HF export at every save)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer (lr 1e-6, verl's; the quickstart config's tiny model uses 3e-3)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP settings of the actor."""
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    """Profiler of the actor (its log-prob and update phases; the worker's whole step in one trace by default)."""


@dataclass
class RefConfig:
    strategy: str = "${actor_rollout_ref.actor.strategy}"
    """Backend of the reference model (follows the actor)."""
    fsdp_config: FSDPConfig = field(default_factory=lambda: FSDPConfig())
    """FSDP settings of the reference model."""
    use_torch_compile: bool = "${actor_rollout_ref.actor.use_torch_compile}"  # type: ignore[assignment]
    """verl key; rlx never compiles (see actor.use_torch_compile)."""
    log_prob_micro_batch_size: Optional[int] = None
    """verl key (deprecated): a global micro-batch; taken as verl takes it, log_prob_micro_batch_size_per_gpu = this
    // (world size // actor.ulysses_sequence_parallel_size), with a note. Use log_prob_micro_batch_size_per_gpu."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per reference log-prob forward on each rank; required unless log_prob_use_dynamic_bsz."""
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    """Form log-prob micro-batches by a token budget (log_prob_max_token_len_per_gpu); outputs keep the batch's
    order (follows actor.use_dynamic_bsz)."""
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    """Token budget of one log-prob micro-batch with log_prob_use_dynamic_bsz (follows
    actor.ppo_max_token_len_per_gpu)."""
    ulysses_sequence_parallel_size: int = \
        "${actor_rollout_ref.actor.ulysses_sequence_parallel_size}"  # type: ignore[assignment]
    """Ulysses sequence parallelism of the reference model's log-prob forward (as
    actor_rollout_ref.actor.ulysses_sequence_parallel_size, which it follows unless set, as in verl; needs
    actor_rollout_ref.model.use_remove_padding=True). 1: off."""
    entropy_from_logits_with_chunking: bool = False
    """As actor.entropy_from_logits_with_chunking, for the reference model's forward (which, as in verl, computes
    log-probs only: the entropy is never asked of the ref, so this changes nothing there)."""
    entropy_from_logits_chunk_size: int = 2048
    """Tokens per chunk of entropy_from_logits_with_chunking."""
    entropy_checkpointing: bool = False
    """As actor.entropy_checkpointing, for the reference model (no backward runs through the ref)."""
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    """Profiler of the reference policy's log-prob phase (it runs in the actor's worker process)."""


def check_policy_loss(cfg, errors):
    actor = cfg.actor_rollout_ref.actor
    pl, key = actor.policy_loss, "actor_rollout_ref.actor.policy_loss"
    if pl.loss_mode == "dro" and (pl.dro_beta is None or not pl.dro_beta > 0):
        errors.append(f"{key}.loss_mode=dro needs {key}.dro_beta > 0, got {pl.dro_beta}. Fix: {key}.dro_beta=0.1.")
    if pl.loss_mode == "clip_cov" and not pl.clip_cov_ratio > 0:
        errors.append(f"{key}.clip_cov_ratio={pl.clip_cov_ratio} must be > 0 with loss_mode=clip_cov. Fix: "
                      f"{key}.clip_cov_ratio=0.0002 (verl's default).")
    if pl.loss_mode == "kl_cov" and not pl.kl_cov_ratio > 0:
        errors.append(f"{key}.kl_cov_ratio={pl.kl_cov_ratio} must be > 0 with loss_mode=kl_cov. Fix: "
                      f"{key}.kl_cov_ratio=0.0002 (verl's default).")
    if actor.loss_scale_factor is not None and not actor.loss_scale_factor > 0:
        errors.append(f"actor_rollout_ref.actor.loss_scale_factor={actor.loss_scale_factor} must be > 0 (or null: "
                      f"the response length). Fix: actor_rollout_ref.actor.loss_scale_factor=null.")
