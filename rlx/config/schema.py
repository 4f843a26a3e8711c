"""Typed configuration: the single source of truth for every key.

`rlx/trainer/config/ppo_trainer.yaml` is the YAML view of these dataclasses (regenerate it with
`python -m rlx.config.export`); a test keeps the two identical. Key names follow verl's ppo_trainer.yaml
so that a verl command line works unchanged. Every leaf key does what its docstring says, or is refused:
keys that verl has and rlx does not implement yet are present with verl's defaults and listed in
`NOT_SUPPORTED` (setting one to another value fails validation); verl's deprecated keys are in `DEPRECATED`;
keys that only mirror another key are in `FOLLOWS`; the few keys that are no-ops by design are in
`NO_OP_BY_DESIGN`, each with the reason. `tests/test_config_keys.py` walks the schema and fails on a key that is
none of these and that no consumer reads.
Each field carries a docstring (the string literal under it); the YAML export turns them into comments.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlx.config.offload import ActivationOffloadConfig


@dataclass
class DataConfig:
    tokenizer: Optional[str] = None
    """Tokenizer path; null uses the actor model's tokenizer."""
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"
    """Parquet file(s) in verl's row format, or a built-in synthetic task `synthetic://<task>/size:N/seed:S`
    (verl's default path; the quickstart config uses a synthetic task)."""
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"
    """Validation parquet file(s) (same format)."""
    prompt_key: str = "prompt"
    """Column holding the chat messages of the prompt."""
    reward_fn_key: str = "data_source"
    """Column whose value picks the reward function (passed to it as `data_source`)."""
    max_prompt_length: int = 512
    """Prompts are left-padded to this many tokens."""
    max_response_length: int = 512
    """Maximum generated tokens per response."""
    train_batch_size: int = 1024
    """Prompts per training step (each sampled rollout.n times)."""
    val_batch_size: Optional[int] = None
    """Prompts per validation batch; null means the whole validation set at once."""
    return_raw_chat: bool = True
    """Keep the raw chat messages in the batch."""
    shuffle: bool = True
    """Shuffle the training set each epoch."""
    seed: Optional[int] = None
    """Seed of the training-set shuffle (null: a fixed default seed, 0; verl's null is torch's fixed default
    generator seed)."""
    filter_overlong_prompts: bool = False
    """Drop prompts longer than max_prompt_length when the dataset loads."""
    truncation: str = "error"
    """What to do with an overlong prompt: error | left | right | middle."""
    apply_chat_template: bool = True
    """Format prompts with the tokenizer's chat template when it has one."""
    trust_remote_code: bool = False
    """Passed to the driver's tokenizer loader (as is actor_rollout_ref.model.trust_remote_code: either one)."""
    dataloader_num_workers: int = 8
    """verl key; prompts are tokenized up front, so rlx loads in the driver."""
    use_shm: bool = False
    """verl key (not supported yet)."""
    return_raw_input_ids: bool = False
    """verl key (not supported yet)."""
    return_full_prompt: bool = False
    """verl key (not supported yet)."""
    validation_shuffle: bool = False
    """verl key (not supported yet)."""
    filter_overlong_prompts_workers: int = 1
    """verl key; filtering runs in the driver."""
    image_key: str = "images"
    """verl key (multi-modal data is not supported yet: a row with images in this column is an error)."""
    video_key: str = "videos"
    """verl key (multi-modal data is not supported yet: a row with videos in this column is an error)."""
    custom_cls: dict = field(default_factory=lambda: {"path": None, "name": None})
    """verl key (custom dataset classes are not supported yet)."""


@dataclass
class FSDPConfig:
    param_offload: bool = False
    """Keep sharded parameters on the CPU between uses."""
    optimizer_offload: bool = False
    """Keep optimizer state on the CPU between updates."""
    offload_policy: bool = False
    """FSDP2 only (strategy fsdp2; an error with fsdp): use CPUOffloadPolicy (parameters, gradients and optimizer
    step on the CPU)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3); False keeps them until backward (ZeRO-2)."""
    fsdp_size: int = -1
    """verl key: FSDP group size (-1: all ranks). Hybrid sharding is not supported yet."""
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


@dataclass
class FusedKernelOptions:
    impl_backend: str = "torch"
    """verl key: the fused head's implementation; rlx has the pure-torch one (CPU and GPU)."""
    chunk_size: int = 2048
    """Tokens per chunk of the fused head: its transient memory is about 3 x chunk_size x vocab x 4 bytes."""


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
    """verl key (not supported yet)."""
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
    use_liger: bool = False
    """verl key (not supported yet)."""
    use_fused_kernels: bool = True
    """Fused log-prob head for the actor and the ref: hidden states -> output projection -> temperature ->
    log-prob (and entropy) in chunks of tokens, recomputed chunk by chunk in backward, never holding
    [tokens, vocab] logits. On by default in rlx (verl's default is off): the full logits cost ~1.8 MB per
    token on a 152k vocabulary and set the longest response that fits."""
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)
    """Options of the fused head."""


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
    warmup_style: str = "constant"
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


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"
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
    """verl key (deprecated global micro-batch); use ppo_micro_batch_size_per_gpu."""
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
    loss_agg_mode: str = "token-mean"
    """token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm (Dr. GRPO: token
    sums over a constant, loss_scale_factor). The seq-mean-* modes divide by every row of the mini-batch, a fully
    masked row included (verl's)."""
    loss_scale_factor: Optional[int] = None
    """The constant divisor of seq-mean-token-sum-norm (null: data.max_response_length, the padded response length);
    the critic's follows it."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient."""
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
    kl_loss_type: str = "low_var_kl"
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
    """verl key (not supported yet)."""
    entropy_checkpointing: bool = False
    """verl key (not supported yet)."""
    checkpoint: CheckpointContents = field(default_factory=lambda: CheckpointContents(
        save_contents=["model", "optimizer", "extra", "hf_model"]))
    """Checkpoint contents (rlx's actor default adds hf_model to verl's: an HF export at every save)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer (lr 1e-6, verl's; the quickstart config's tiny model uses 3e-3)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP settings of the actor."""


@dataclass
class RefConfig:
    strategy: str = "${actor_rollout_ref.actor.strategy}"
    """Backend of the reference model (follows the actor)."""
    fsdp_config: FSDPConfig = field(default_factory=lambda: FSDPConfig())
    """FSDP settings of the reference model."""
    use_torch_compile: bool = "${actor_rollout_ref.actor.use_torch_compile}"  # type: ignore[assignment]
    """verl key; rlx never compiles (see actor.use_torch_compile)."""
    log_prob_micro_batch_size: Optional[int] = None
    """verl key (deprecated); use log_prob_micro_batch_size_per_gpu."""
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
    """verl key (not supported yet)."""
    entropy_checkpointing: bool = False
    """verl key (not supported yet)."""


@dataclass
class ValKwargs:
    top_k: int = -1
    """Validation top-k."""
    top_p: float = 1.0
    """Validation top-p."""
    temperature: float = 0.0
    """Validation temperature (0: greedy)."""
    n: int = 1
    """Samples per validation prompt."""
    do_sample: bool = False
    """Sample during validation (False: greedy)."""


@dataclass
class RolloutConfig:
    name: str = "auto"
    """Rollout engine: vllm | hf | auto (vllm when it imports, else hf, with one log line)."""
    mode: str = "sync"
    """verl key: only sync rollout is supported."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_k: int = -1
    """Top-k (-1: off)."""
    top_p: float = 1.0
    """Top-p."""
    do_sample: bool = True
    """Sample (False: greedy)."""
    n: int = 1
    """Responses per prompt (GRPO/RLOO group size: >= 2)."""
    seed: int = 42
    """Base sampling seed (each rank adds its rank)."""
    prompt_length: int = "${data.max_prompt_length}"  # type: ignore[assignment]
    """Follows data.max_prompt_length (any other value is an error: set data.max_prompt_length)."""
    response_length: int = "${data.max_response_length}"  # type: ignore[assignment]
    """Follows data.max_response_length (any other value is an error: set data.max_response_length)."""
    dtype: str = "bfloat16"
    """Rollout weights dtype on GPUs, vLLM and HF: bfloat16 | float16 | float32 (CPU runs use float32)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take (weights + KV cache)."""
    ignore_eos: bool = False
    """Keep generating past EOS: every response is max_response_length tokens (EOS tokens included, unmasked)."""
    enforce_eager: bool = False
    """Disable CUDA graphs in vLLM."""
    free_cache_engine: bool = True
    """Free the KV cache (vLLM sleep) between rollouts."""
    load_format: str = "dummy"
    """How the vLLM engine gets its first weights, before the sync from FSDP that precedes every generation:
    dummy_dtensor | dummy (verl's default: random, nothing read from disk) | auto | safetensors | pt (the
    checkpoint's files)."""
    layered_summon: bool = False
    """verl key (not supported yet)."""
    tensor_model_parallel_size: int = 2
    """vLLM tensor parallel size (must divide the world size; > 1 needs GPUs)."""
    max_num_batched_tokens: int = 8192
    """vLLM scheduler token budget."""
    max_model_len: Optional[int] = None
    """vLLM context length; null: max_prompt_length + max_response_length."""
    max_num_seqs: int = 256
    """vLLM concurrent sequences."""
    log_prob_micro_batch_size: Optional[int] = None
    """verl key (deprecated); use log_prob_micro_batch_size_per_gpu."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per old-log-prob forward on each rank; required unless log_prob_use_dynamic_bsz."""
    log_prob_use_dynamic_bsz: bool = "${actor_rollout_ref.actor.use_dynamic_bsz}"  # type: ignore[assignment]
    """Form log-prob micro-batches by a token budget (log_prob_max_token_len_per_gpu); outputs keep the batch's
    order (follows actor.use_dynamic_bsz)."""
    log_prob_max_token_len_per_gpu: int = "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    """Token budget of one log-prob micro-batch with log_prob_use_dynamic_bsz (follows
    actor.ppo_max_token_len_per_gpu)."""
    disable_log_stats: bool = True
    """vLLM stats logging off."""
    enable_chunked_prefill: bool = True
    """vLLM chunked prefill."""
    calculate_log_probs: bool = True
    """Return the rollout's log-probs (logs training/rollout_probs_diff_*)."""
    engine_kwargs: dict = field(default_factory=lambda: {"vllm": {}, "sglang": {}, "trtllm": {}})
    """Extra keyword arguments for the engine, under vllm (verl's other engines' entries must stay empty)."""
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    """Sampling during validation."""


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    """Actor, rollout and ref share one worker (the only mode: False is not supported)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy training."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference policy (KL)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""


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
    use_shm: bool = False
    """verl key (not supported yet)."""
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
    """verl key (deprecated); use ppo_micro_batch_size_per_gpu."""
    ppo_micro_batch_size_per_gpu: Optional[int] = "${actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}"  # type: ignore[assignment]
    """Sequences per critic forward/backward on each rank."""
    forward_micro_batch_size: Optional[int] = None
    """verl key (deprecated); use forward_micro_batch_size_per_gpu."""
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
    loss_agg_mode: str = "${actor_rollout_ref.actor.loss_agg_mode}"
    """Aggregation of the value loss (actor.loss_agg_mode's choices)."""
    loss_scale_factor: Optional[int] = "${actor_rollout_ref.actor.loss_scale_factor}"  # type: ignore[assignment]
    """The divisor of seq-mean-token-sum-norm for the value loss (follows actor.loss_scale_factor)."""
    checkpoint: CheckpointContents = field(default_factory=CheckpointContents)
    """Checkpoint contents."""


@dataclass
class RewardModelConfig:
    enable: bool = False
    """verl key: model-based rewards are not supported yet (rule rewards only)."""
    strategy: str = "fsdp"
    """verl key (reward models are not supported yet)."""
    reward_manager: str = "naive"
    """Reward manager (verl's names): naive (one score per response, on its last valid token) | dapo (naive plus
    DAPO's overlong penalty, reward_kwargs.overlong_buffer_cfg) | batch (the score function takes lists:
    compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list)."""
    reward_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of the score function (e.g. format_score); with reward_manager=dapo, verl's
    overlong_buffer_cfg {enable, len, penalty_factor, log} and max_resp_len (default data.max_response_length)
    go to the manager: a response longer than max_resp_len - len loses (length - (max_resp_len - len)) / len *
    penalty_factor."""
    launch_reward_fn_async: bool = False
    """verl key (not supported yet)."""
    non_finite_score: Optional[float] = None
    """A NaN or infinite score from the reward function: null stops the run with an error naming the function, the
    data_source and the sample; a number replaces the score (each replacement counted in
    reward/non_finite_count)."""
    model: dict = field(default_factory=lambda: {"path": None, "external_lib": None, "trust_remote_code": None})
    """verl key (reward models are not supported yet)."""
    micro_batch_size_per_gpu: Optional[int] = None
    """verl key (reward models are not supported yet)."""


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = None
    """Python file that defines the score function."""
    name: str = "compute_score"
    """Function name: compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict."""


@dataclass
class KLCtrlConfig:
    type: str = "fixed"
    """fixed | adaptive."""
    kl_coef: float = 0.001
    """(Initial) KL coefficient of the in-reward penalty."""
    horizon: int = 10000
    """Adaptive controller horizon."""
    target_kl: float = 0.1
    """Adaptive controller target."""


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    """Discount."""
    lam: float = 1.0
    """GAE lambda."""
    adv_estimator: str = "gae"
    """Advantage estimator (verl's names; docs/algorithms.md): gae | grpo | rloo | reinforce_plus_plus |
    reinforce_plus_plus_baseline | remax (greedy baseline) | opo | gpg | grpo_passk | grpo_vectorized |
    rloo_vectorized | optimal_token_baseline | tir_optimal_token_baseline (need actor.calculate_sum_pi_squared) |
    gdpo (needs gdpo_reward_keys)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-relative advantages by the group std (grpo, grpo_vectorized, grpo_passk, gdpo); False: Dr. GRPO."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty from the token rewards."""
    kl_penalty: str = "kl"
    """KL estimator of the in-reward penalty: kl(k1) | abs | mse(k2) | low_var_kl(k3), and their + forms (same
    values here: the penalty carries no gradient)."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """KL controller of the in-reward penalty."""
    use_pf_ppo: bool = False
    """verl key (not supported yet)."""
    gdpo_reward_keys: Optional[list] = None
    """gdpo: the keys of the reward function's dict whose values are the reward components, each normalised within
    its group on its own (e.g. [format_reward, accuracy_reward]); required with adv_estimator=gdpo."""
    gdpo_reward_weights: Optional[list] = None
    """gdpo: one weight per gdpo_reward_keys entry (null: 1 each)."""


@dataclass
class TrainerConfig:
    balance_batch: bool = True
    """Reorder each training batch so that every data-parallel rank gets the same number of rows and about the
    same number of tokens (verl's balance_batch; logs global_seqlen/*)."""
    total_epochs: int = 30
    """Epochs over the training set."""
    total_training_steps: Optional[int] = None
    """Stop after this many steps (null: total_epochs over the data)."""
    project_name: str = "verl_examples"
    """Project name (loggers, checkpoint dir)."""
    experiment_name: str = "gsm8k"
    """Experiment name (loggers, checkpoint dir)."""
    logger: list = field(default_factory=lambda: ["console", "wandb"])
    """Loggers: console | file (metrics.jsonl under <default_local_dir>/logs) | tensorboard | wandb."""
    log_val_generations: int = 0
    """Validation samples (prompt, response, score) logged per validation, chosen as verl does (sorted, then
    shuffled with seed 42): printed by the console logger, a text/table entry for tensorboard/wandb, a
    val_generations record for file."""
    nnodes: int = 1
    """Nodes."""
    n_gpus_per_node: int = 8
    """Workers per node (GPUs, or CPU processes with device=cpu)."""
    device: str = "auto"
    """auto | cuda (nccl) | cpu (gloo). auto: cuda when the driver sees a GPU, else cpu (a driver joining a cluster
    from a machine without GPUs must say cuda)."""
    save_freq: int = -1
    """Save a checkpoint every N steps (-1: never)."""
    resume_mode: str = "auto"
    """auto | disable | resume_path."""
    resume_from_path: Optional[str] = None
    """Checkpoint dir used with resume_mode=resume_path."""
    val_before_train: bool = True
    """Validate before the first step."""
    val_only: bool = False
    """Only validate."""
    test_freq: int = -1
    """Validate every N steps (-1: only before training and at the end)."""
    critic_warmup: int = 0
    """Steps that update only the critic."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Checkpoint and log root (a relative path is relative to the driver's working directory; a `ray job submit`
    job needs an absolute one)."""
    default_hdfs_dir: Optional[str] = None
    """verl key (not supported yet)."""
    del_local_ckpt_after_load: bool = False
    """verl key (not supported yet)."""
    max_actor_ckpt_to_keep: Optional[int] = None
    """Keep at most this many actor checkpoints (null: all)."""
    max_critic_ckpt_to_keep: Optional[int] = None
    """Keep at most this many critic checkpoints (null: all)."""
    on_damaged_checkpoint: str = "previous"
    """Resume when the newest checkpoint fails its checksums (COMPLETE records one per file): previous (resume from
    the newest earlier checkpoint that verifies; the damaged file is reported) | error (stop)."""
    max_consecutive_skipped_steps: int = 3
    """Stop the run (non-zero exit) after this many consecutive training steps whose optimizer step was skipped
    for a non-finite gradient norm (actor or critic; counted in actor/skipped_steps, critic/skipped_steps).
    0: never stop."""
    rollout_data_dir: Optional[str] = None
    """verl key (not supported yet)."""
    validation_data_dir: Optional[str] = None
    """verl key (not supported yet)."""
    seed: int = 0
    """Seed of model init and sampling."""


@dataclass
class RayInitConfig:
    address: Optional[str] = None
    """Ray cluster to join: auto (the cluster `ray start` started on this machine) or <head-ip>:6379; null:
    RAY_ADDRESS if set, else a new local Ray (never one found in Ray's temp folder)."""
    num_cpus: Optional[int] = None
    """CPUs of a local Ray (null: all)."""
    timeline_json_file: Optional[str] = None
    """Write Ray's task timeline (chrome://tracing JSON) to this file when the run ends."""


@dataclass
class RLXConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and lengths."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Actor, rollout and reference policy."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (used by gae)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward settings."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """User score function."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation and KL."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, logging, checkpoints, resources."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """Ray."""


# verl keys that exist for compatibility but are not implemented: key -> the only accepted value.
NOT_SUPPORTED: dict[str, Any] = {
    "data.use_shm": False,
    "data.return_raw_input_ids": False,
    "data.return_full_prompt": False,
    "data.validation_shuffle": False,
    "data.image_key": "images",
    "data.video_key": "videos",
    "data.custom_cls": {"path": None, "name": None},
    "actor_rollout_ref.model.use_shm": False,
    "actor_rollout_ref.model.use_liger": False,
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": "torch",
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": False,
    "actor_rollout_ref.actor.entropy_checkpointing": False,
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": -1,
    "actor_rollout_ref.actor.fsdp_config.wrap_policy": {"min_num_params": 0},
    "actor_rollout_ref.actor.optim.total_training_steps": -1,
    "actor_rollout_ref.hybrid_engine": True,
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": False,
    "actor_rollout_ref.ref.entropy_checkpointing": False,
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": -1,
    "actor_rollout_ref.ref.fsdp_config.wrap_policy": {"min_num_params": 0},
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": False,  # the ref has no optimizer
    "actor_rollout_ref.rollout.mode": "sync",
    "actor_rollout_ref.rollout.layered_summon": False,
    "critic.model.use_shm": False,
    "critic.model.lora_rank": 0,
    "critic.model.fsdp_config.fsdp_size": -1,
    "critic.model.fsdp_config.wrap_policy": {"min_num_params": 0},
    "critic.optim.total_training_steps": -1,
    "reward_model.enable": False,
    "reward_model.strategy": "fsdp",
    "reward_model.model": {"path": None, "external_lib": None, "trust_remote_code": None},
    "reward_model.micro_batch_size_per_gpu": None,
    "reward_model.launch_reward_fn_async": False,
    "algorithm.use_pf_ppo": False,
    "trainer.default_hdfs_dir": None,
    "trainer.del_local_ckpt_after_load": False,
    "trainer.rollout_data_dir": None,
    "trainer.validation_data_dir": None,
}


# verl's deprecated global batch-size keys: refused unless null, pointing at the per-GPU key that replaces them.
DEPRECATED: dict[str, str] = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size":
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size": "critic.forward_micro_batch_size_per_gpu",
}

# Keys that mirror another key (their default interpolates it) and must keep its value: rlx reads the other one.
FOLLOWS: dict[str, str] = {
    "actor_rollout_ref.rollout.prompt_length": "data.max_prompt_length",
    "actor_rollout_ref.rollout.response_length": "data.max_response_length",
}

# verl keys that are accepted with any value and do nothing in rlx, each with the reason it is honest to accept
# them. Keep this short: a key that changes what verl computes is implemented or refused, never listed here.
NO_OP_BY_DESIGN: dict[str, str] = {
    "data.dataloader_num_workers": "loader speed only: rlx tokenizes every prompt once, up front, in the driver",
    "data.filter_overlong_prompts_workers": "speed only: the filter runs in the driver and drops the same prompts",
    "actor_rollout_ref.actor.use_torch_compile": "speed only: rlx never compiles, whatever the value",
    "actor_rollout_ref.ref.use_torch_compile": "speed only: rlx never compiles, whatever the value",
    # the critic's LoRA details are inert in verl too while its lora_rank is 0; that key is refused (NOT_SUPPORTED),
    # so verl scripts that pass lora_alpha/target_modules next to critic lora_rank=0 keep working.
    "critic.model.lora_alpha": "inert without critic.model.lora_rank > 0 (refused), as in verl",
    "critic.model.target_modules": "inert without critic.model.lora_rank > 0 (refused), as in verl",
}


# The keys whose rlx default is not verl 0.9.1's (every other key shared with verl has verl's default; the test
# tests/test_verl_defaults.py holds verl's values). Each one changes speed, memory or what is written to disk, never
# what is trained; README.md shows this list. Values are {key: (rlx default, verl default, reason)}.
VERL_DEFAULT_EXCEPTIONS: dict[str, tuple[Any, Any, str]] = {
    "actor_rollout_ref.actor.strategy": (
        "fsdp2", "fsdp", "FSDP2 (fully_shard) shards the same model and computes the same gradients as FSDP1, with "
        "less memory and CPU offload of the optimizer step (fsdp_config.offload_policy); fsdp stays available"),
    "actor_rollout_ref.ref.strategy": (
        "fsdp2", "fsdp", "follows actor.strategy, as in verl (verl's resolves to fsdp)"),
    "critic.strategy": (
        "fsdp2", "fsdp", "follows actor.strategy (verl's is a literal fsdp); FSDP1 and FSDP2 compute the same values"),
    "actor_rollout_ref.model.use_fused_kernels": (
        True, False, "the fused log-prob head computes the same log-probs and entropy in chunks of tokens, never "
        "holding [tokens, vocab] logits (~1.8 MB per token on a 152k vocabulary): memory only"),
    "actor_rollout_ref.actor.checkpoint.save_contents": (
        ["model", "optimizer", "extra", "hf_model"], ["model", "optimizer", "extra"],
        "adds an HF-format export of the actor to every checkpoint (disk and save time; verl converts offline); "
        "what is trained and resumed is the same"),
    "actor_rollout_ref.rollout.name": (
        "auto", "???", "verl has no default (it must be given); auto picks vllm when it imports, else hf: the engine "
        "changes speed, not the sampling distribution"),
    "actor_rollout_ref.rollout.mode": (
        "sync", "async", "rlx generates with a colocated engine in sync mode only (async is refused); for a "
        "single-turn rollout that changes scheduling, not what is sampled"),
    "trainer.device": (
        "auto", "cuda", "auto is cuda when the driver sees a GPU (verl's value) and cpu otherwise, where verl cannot "
        "run at all"),
}
