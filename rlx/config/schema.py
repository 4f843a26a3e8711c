"""Typed configuration: the single source of truth for every key.

`rlx/trainer/config/ppo_trainer.yaml` is the YAML view of these dataclasses (regenerate it with
`python -m rlx.config.export`); a test keeps the two identical. Key names follow verl's ppo_trainer.yaml
so that a verl command line works unchanged. Every leaf key does what its docstring says, or is refused:
keys that verl has and rlx does not implement yet are present with verl's defaults and listed in
`NOT_SUPPORTED` (these tables: rlx.config.verl_compat) (setting one to another value fails validation); verl's deprecated keys are in `DEPRECATED`;
keys that only mirror another key are in `FOLLOWS`; the few keys that are no-ops by design are in
`NO_OP_BY_DESIGN`, each with the reason. `tests/test_config_keys.py` walks the schema and fails on a key that is
none of these and that no consumer reads.
Each field carries a docstring (the string literal under it); the YAML export turns them into comments.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from rlx.config.agent import AgentLoopConfig, MultiTurnConfig
from rlx.config.async_training import AsyncTrainingConfig, RolloutPoolConfig
from rlx.config.offload import ActivationOffloadConfig
from rlx.config.judge import RewardJudgeConfig
from rlx.config.reward import RewardModelRolloutConfig, RewardSection, SandboxFusionConfig
from rlx.config.profiler import GlobalProfilerConfig, RoleProfilerConfig, RolloutProfilerConfig


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
    gen_batch_size: Optional[int] = None
    """Prompts per generation round, the training loader's batch size (null: train_batch_size). With
    algorithm.filter_groups.enable, rounds of gen_batch_size prompts are generated until train_batch_size groups
    are kept (DAPO's dynamic sampling); without it, it must equal train_batch_size."""
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
    """Copy each data file (train_files, val_files) to shared memory (/dev/shm) once and read it from there, as
    verl's copy_to_local(use_shm=True); a file already there is reused (see docs/rollout_memory.md)."""
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
    """A dataset class of your own, loaded from a Python file: {path: <file.py>, name: <class name>} (null path:
    rlx's RLDataset). The file is imported and run, as verl does: point it only at code you trust. The class is
    built as cls(data_files, tokenizer, config) (config: this data section) and must have rlx's dataset interface
    (__len__, __getitem__, collate, data_sources; subclassing rlx.data.dataset.RLDataset gives all four; see
    docs/data.md); checked before the run starts."""
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of the tokenizer's apply_chat_template when prompts are formatted (training and
    validation), e.g. {enable_thinking: false} or {reasoning_effort: low}; the chat template reads them."""


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
class FusedKernelOptions:
    impl_backend: str = "torch"
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
    loss_agg_mode: str = "token-mean"
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
class CheckpointEngineConfig:
    backend: str = "naive"
    """Weight-sync backend: naive (the only one: the colocated engine is loaded in place from the gathered
    weights; verl's nccl, nixl, hccl, ... serve rollout engines on other GPUs, which rlx does not run)."""
    update_weights_bucket_megabytes: int = 2048
    """verl key, accepted with any value: verl packs the weights into buckets of this size to send them to a vLLM
    server in another process; rlx's engine runs in the training process and is handed each gathered tensor by
    reference, so there is no transfer buffer to size (the sync's peak is one parameter, or one layer with
    rollout.layered_summon, whatever this says)."""
    engine_kwargs: dict = field(default_factory=dict)
    """Arguments of the checkpoint engine's constructor (none for naive: must stay empty)."""
    custom_backend_module: Optional[str] = None
    """A module registering a custom backend (not supported: must stay null)."""


@dataclass
class TraceConfig:
    backend: Optional[str] = None
    """verl key, refused (only null): verl records each agent-loop trajectory to a tracing service (weave | mlflow);
    rlx has no rollout tracing (see NOT_SUPPORTED_REASONS). The other trace keys are inert while this is null, as in
    verl."""
    token2text: bool = False
    """verl: decode the traced token ids to text (inert without trace.backend, as in verl)."""
    max_samples_per_step_per_worker: Optional[int] = None
    """verl: how many trajectories each worker traces per step (inert without trace.backend, as in verl)."""
    project_name: Optional[str] = "${trainer.project_name}"  # type: ignore[assignment]
    """verl: the tracing service's project (inert without trace.backend, as in verl)."""
    experiment_name: Optional[str] = "${trainer.experiment_name}"  # type: ignore[assignment]
    """verl: the tracing service's experiment (inert without trace.backend, as in verl)."""


@dataclass
class RolloutConfig:
    name: str = "auto"
    """Rollout engine: vllm | hf | auto (vllm when it imports, else hf, with one log line)."""
    mode: str = "sync"
    """sync: one batched generate call per step | async: verl's agent loop, every trajectory its own coroutine
    whose requests go to the engine concurrently (rollout.agent.*; rollout.multi_turn.enable runs it too)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_k: int = -1
    """Top-k (-1: off)."""
    top_p: float = 1.0
    """Top-p."""
    do_sample: bool = True
    """Sample (False: greedy)."""
    n: int = 1
    """Responses per prompt (the GRPO/RLOO group size; with n=1 each group holds one response and, as in verl, its
    advantage is its score: GRPO takes mean 0 and std 1 for a group of one, RLOO has no other response)."""
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
    """Bound what the weight sync unshards at once by one FSDP unit: with strategy=fsdp (FSDP1) each decoder layer
    is summoned alone (then the root's embedding, norm and head), its LoRA adapters merged and its tensors streamed
    into vLLM before the next is summoned, instead of summoning the whole model at once (slower: one gather per
    unit). verl's "for huge models, layered summon saves memory"; verl applies it to its LoRA sync, rlx (which syncs
    merged full weights) to every sync. fsdp2 gathers one parameter at a time either way (finer than a unit), so
    the key changes nothing there. The same weights reach vLLM either way (see docs/rollout_memory.md)."""
    multi_stage_wake_up: bool = False
    """verl key, accepted with any value: vLLM's memory is woken in stages on every sync, as verl 0.9.1 does with
    vLLM whatever this key says (it read it only for SGLang): the weights first, then the sync, then the KV cache
    once the gathered weights are freed (see docs/rollout_memory.md)."""
    tensor_model_parallel_size: int = 2
    """vLLM tensor parallel size (must divide the world size; > 1 needs GPUs)."""
    data_parallel_size: int = 1
    """verl key, refused above 1 (see NOT_SUPPORTED_REASONS): vLLM's own data parallelism inside one rollout server
    of tp x dp GPUs. rlx runs one engine per tensor-parallel group, world size / tensor_model_parallel_size engines
    in all, which is verl's layout at its default 1."""
    expert_parallel_size: int = 1
    """verl key, refused above 1 (see NOT_SUPPORTED_REASONS): vLLM's expert parallelism, a mixture-of-experts model's
    experts spread over the tp x dp GPUs of one rollout server (verl requires it to equal tp x dp)."""
    max_num_batched_tokens: int = 8192
    """vLLM scheduler token budget."""
    max_model_len: Optional[int] = None
    """vLLM context length; null: max_prompt_length + max_response_length."""
    max_num_seqs: int = 256
    """vLLM concurrent sequences."""
    log_prob_micro_batch_size: Optional[int] = None
    """verl key (deprecated): a global micro-batch; taken as verl takes it, log_prob_micro_batch_size_per_gpu = this
    // (world size // actor.ulysses_sequence_parallel_size), with a note. Use log_prob_micro_batch_size_per_gpu."""
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
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn tool calling (the tool_agent loop)."""
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    """The agent loop of rollout.mode=async."""
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    """How the trained weights reach the rollout engine (verl's checkpoint engine)."""
    profiler: RolloutProfilerConfig = field(default_factory=RolloutProfilerConfig)
    """Profiler of the rollout phase (weight sync and generation, in the actor's worker process)."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """verl's rollout tracing (weave / mlflow): refused, its keys inert while trace.backend is null."""


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    """Actor, rollout and ref share one worker and its GPUs (verl's colocated layout). False: the rollout runs on
    GPUs of its own (the top-level rollout section) and overlaps training (async_training; rlx.config.async_training)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy training."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference policy (KL)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    nccl_timeout: int = 600
    """Seconds a collective of the actor/rollout/ref workers' process group (NCCL on GPU, gloo on CPU) waits for
    the other ranks before it fails the run (verl's: the timeout of init_process_group). The critic's group uses
    600, as verl's FSDP critic does."""


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
    loss_agg_mode: str = "${actor_rollout_ref.actor.loss_agg_mode}"
    """Aggregation of the value loss (actor.loss_agg_mode's choices)."""
    loss_scale_factor: Optional[int] = "${actor_rollout_ref.actor.loss_scale_factor}"  # type: ignore[assignment]
    """The divisor of seq-mean-token-sum-norm for the value loss (follows actor.loss_scale_factor)."""
    checkpoint: CheckpointContents = field(default_factory=CheckpointContents)
    """Checkpoint contents."""
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    """Profiler of the critic worker."""


@dataclass
class RewardModelModelConfig:
    path: Optional[str] = None
    """The reward model: an HF directory of a sequence-classification model with one label (e.g.
    Qwen2ForSequenceClassification; a token-classification checkpoint loads the same head), or
    builtin://tiny-qwen2-rm. Needed with reward_model.enable=True."""
    input_tokenizer: Optional[str] = None
    """The actor's tokenizer, when the reward model's differs (verl's key): each response is then decoded with it
    and the conversation (prompt messages + the response as the assistant's turn) re-templated with the reward
    model's own chat template. null: re-template only when the reward model's tokenizer is not the actor's
    (another vocabulary or chat template); otherwise the model scores the actor's own token ids."""
    external_lib: Optional[str] = None
    """A module imported before the model is built (registers a custom architecture)."""
    trust_remote_code: bool = False
    """Allow the model's own code from its directory (verl's legacy default is null: off)."""
    override_config: dict = field(default_factory=dict)
    """Entries set on the model's HF config before it is built."""
    use_remove_padding: bool = True
    """Score packed rows (padding removed) instead of padded ones; the scores are the same."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the reward model (param_offload: its parameters live on the CPU between scoring calls)."""


@dataclass
class RewardModelConfig:
    enable: bool = False
    """Score responses with a reward model (reward_model.model.path): a worker role of its own (FSDP, no
    optimizer) colocated with the actor's GPUs. Its score replaces the rule reward, as in verl: it goes on the
    response's last valid token. With custom_reward_function.path the custom function scores instead (verl's
    precedence)."""
    strategy: str = "${actor_rollout_ref.actor.strategy}"
    """fsdp | fsdp2: how the reward model is sharded (follows the actor's, as the ref's does)."""
    reward_manager: str = "naive"
    """Reward manager (verl's names): naive (one score per response, on its last valid token) | dapo (naive plus
    DAPO's overlong penalty, reward_kwargs.overlong_buffer_cfg) | batch (the score function takes lists:
    compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list)."""
    reward_kwargs: dict = field(default_factory=dict)
    """Arguments of the dapo reward manager (as in verl, nothing here reaches the score function):
    overlong_buffer_cfg {enable, len, penalty_factor, log} and max_resp_len (default data.max_response_length): a
    response longer than max_resp_len - len loses (length - (max_resp_len - len)) / len * penalty_factor."""
    score_kwargs: dict = field(default_factory=dict)
    """rlx key: keyword arguments of the built-in score functions (no custom_reward_function.path), e.g.
    {method: flexible, format_score: 0.1} for GSM8K. Empty: verl's default_compute_score, each scorer with its
    defaults (verl has no way to change them)."""
    launch_reward_fn_async: bool = False
    """verl key (not supported yet)."""
    non_finite_score: Optional[float] = None
    """A NaN or infinite score from the reward function: null stops the run with an error naming the function, the
    data_source and the sample; a number replaces the score (each replacement counted in
    reward/non_finite_count)."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """The reward model (with enable=True)."""
    judge: RewardJudgeConfig = field(default_factory=RewardJudgeConfig)
    """rlx keys: the reward model as a generative judge (judge.enable=True; its prompt template, score range and
    sampling). Off: a discriminative reward model (a classifier)."""
    micro_batch_size: Optional[int] = None
    """Deprecated global form of micro_batch_size_per_gpu (divided by the world size, as verl does)."""
    micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per scoring forward on each GPU (or use_dynamic_bsz)."""
    max_length: Optional[int] = None
    """Longest re-templated conversation the reward model reads, in its tokens: a longer one loses its beginning
    (the score is read at the end). null: no limit (verl 0.9.1's reward loop scores the whole conversation)."""
    use_dynamic_bsz: bool = "${critic.use_dynamic_bsz}"  # type: ignore[assignment]
    """Form the scoring micro-batches by a token budget (forward_max_token_len_per_gpu) instead of a count (also
    what happens when micro_batch_size_per_gpu is null, as in verl 0.9.1 commands, which have no such key)."""
    forward_max_token_len_per_gpu: int = "${critic.forward_max_token_len_per_gpu}"  # type: ignore[assignment]
    """Token budget of one scoring micro-batch per GPU (use_dynamic_bsz, or no micro_batch_size_per_gpu)."""
    use_reward_loop: Optional[bool] = None
    """verl: serve the reward model through verl's reward loop (its only way in 0.9.1; it serves a classifier and a
    judge alike). rlx scores with its own reward-model worker whatever the value: see NO_OP_BY_DESIGN (a judge is
    reward_model.judge.enable)."""
    num_workers: Optional[int] = None
    """verl: how many CPU processes send requests to the reward model's server (speed only)."""
    rollout: RewardModelRolloutConfig = field(default_factory=RewardModelRolloutConfig)
    """verl: the engine that serves the reward model (its name, dtype and lengths act in rlx; its serving knobs
    set the generative judge's vLLM engine, and do nothing for a classifier)."""
    enable_resource_pool: bool = False
    """verl: the reward model on GPUs of its own, a placement group of reward_model.nnodes x
    reward_model.n_gpus_per_node (both required) next to the trainer's, one reward-model rank per GPU holding the
    whole GPU; False: colocated, rank i on the trainer's GPU i. The same scores either way. Inert without a reward
    model (rlx then reserves nothing)."""
    n_gpus_per_node: Optional[int] = None
    """verl: GPUs per node of the reward model's own pool (read with enable_resource_pool=True)."""
    nnodes: Optional[int] = None
    """verl: nodes of the reward model's own pool (read with enable_resource_pool=True)."""
    reward_loop_source: Optional[str] = None
    """verl: where a custom reward-loop manager comes from (not supported)."""
    reward_loop_module_path: Optional[str] = None
    """verl: a custom reward-loop manager's file (not supported)."""
    reward_loop_class_name: Optional[str] = None
    """verl: a custom reward-loop manager's class (not supported)."""


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = None
    """Python file that defines the score function."""
    name: str = "compute_score"
    """Function name: compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict."""
    reward_kwargs: dict = field(default_factory=dict)
    """Keyword arguments bound to the custom function (verl's `+custom_reward_function.reward_kwargs.*`); needs
    path (for the built-in rewards: reward_model.score_kwargs)."""


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
class FilterGroupsConfig:
    enable: bool = False
    """DAPO's dynamic sampling: drop the groups (a prompt's rollout.n responses) whose `metric` is the same for
    every response, and generate more rounds of data.gen_batch_size prompts until data.train_batch_size groups
    are kept; the batch is then cut to train_batch_size groups."""
    metric: str = "reward"
    """What must vary within a group: reward or seq_reward (the sum of the response's scores, before any KL
    penalty), seq_final_reward (the same: the in-reward KL penalty is refused with dynamic sampling), or a key the
    score function returns in its dict (acc, score, pred, ...; score is the dict's score before any overlong
    penalty, as in verl; acc and score are the score itself for a function returning a number)."""
    max_num_gen_batches: int = 0
    """Generation rounds allowed per training step; the step fails with an error when they are used up before
    enough groups are kept. 0 or less: no limit."""
    max_inflight_gen_batches: int = 1
    """verl key: prompt batches generated concurrently by verl's V1 sampler (speed only; rlx generates one round
    at a time)."""


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = None
    """Importance weights pi_old / pi_rollout against the rollout engine's own log-probs (needs
    actor_rollout_ref.rollout.calculate_log_probs=True), multiplying each token's policy loss: token (w_t =
    exp(log pi_old - log pi_rollout) per token) | sequence (their product, on every token of the response) | null
    (none). With calculate_log_probs=True the rollout_corr/* diagnostics are logged whatever this is."""
    rollout_is_threshold: Any = 2.0
    """A number: weights truncated at it (TIS); a "lower_upper" string (e.g. "0.5_5.0"): weights outside
    [lower, upper] set to 0 (IcePop)."""
    rollout_rs: Optional[str] = None
    """Rejection sampling: tokens whose statistic is out of bounds leave the response mask; comma-separated options,
    all must accept: token_k1 | token_k2 | token_k3 (per token), seq_sum_k1/k2/k3, seq_mean_k1/k2/k3, seq_max_k2/k3
    (per response, the whole response leaves). k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r with
    r = pi_old / pi_rollout. null: none."""
    rollout_rs_threshold: Any = None
    """Bounds of rollout_rs, one for all options or one per option (comma-separated): k1 takes "lower_upper" ratio
    bounds or an upper one (the lower is its reciprocal); k2 / k3 take one positive upper bound."""
    bypass_mode: bool = False
    """verl's bypass mode: the rollout engine's log-probs serve as the old log-probs (no old log-prob pass; needs
    actor_rollout_ref.rollout.calculate_log_probs=True), and the importance weights and rejection mask above are
    computed in the actor's loss, per micro-batch, against the current policy (loss_type says how they are used)."""
    loss_type: str = "ppo_clip"
    """The policy loss of bypass_mode: ppo_clip (PPO's clipped loss with ratio pi / pi_rollout, on the rejection
    mask; the weights only as metrics) | reinforce (-A * log pi * w, w the importance weights). Inert without
    bypass_mode, as in verl."""
    rollout_is_batch_normalize: bool = False
    """Divide the importance weights by their mean over the batch's valid tokens (token level) or responses
    (sequence level)."""


@dataclass
class PFPPOConfig:
    reweight_method: str = "pow"
    """How each response's weight comes from its score s (the sum of its token scores): pow (|s|^weight_pow) |
    max_min (1 for the batch's highest and lowest s, else 0) | max_random (0.4 for the highest s, else 0.1)."""
    weight_pow: float = 2.0
    """Exponent of the pow method."""


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
    """Policy Filtration PPO (Zhang et al. 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code
    Generation"): after GAE, the batch is resampled with replacement (same size), each response drawn with
    probability proportional to its pf_ppo weight. As in verl, only adv_estimator=gae resamples."""
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    """Weights of use_pf_ppo's resampling."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Correction of the mismatch between the rollout engine's policy and the trainer's (importance weights,
    rejection sampling), as verl's decoupled mode."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale")."""
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
    """Loggers: console | file (metrics.jsonl under <default_local_dir>/logs) | tensorboard | wandb | swanlab (the
    optional extra rlx[swanlab]; wandb and swanlab log offline to <default_local_dir>/logs without an API key)."""
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
    use_legacy_worker_impl: str = "auto"
    """verl key: auto | enable | disable picks between verl's two worker implementations (its legacy FSDP workers
    and its newer engine workers), which train the same model. rlx has one worker implementation, so every value
    verl accepts runs the same; another value is refused, as verl refuses it."""
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
    """Write each training step's rollouts to <dir>/<step>.jsonl (input, output, gts, score, step, the reward
    function's extra values), as verl does; null: none."""
    validation_data_dir: Optional[str] = None
    """Write each validation's samples to <dir>/<step>.jsonl (input, output, gts, score, step); null: none."""
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
    reward: RewardSection = field(default_factory=RewardSection)
    """verl 0.9.1's reward section: each key is another spelling of a legacy key (rlx.config.reward.ALIASES) and
    acts as that key; setting both spellings to different values is an error."""
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    """verl's remote code sandbox for code rewards (not supported)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation and KL."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, logging, checkpoints, resources."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """Ray."""
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)
    """Profiling: which steps, which tool, where the traces go (each role's profiler key says which ranks)."""
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    """The rollout's own GPUs with actor_rollout_ref.hybrid_engine=False (verl's disaggregated recipes)."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """How far the disaggregated rollout runs ahead of the trainer (staleness bound, sync period, partial rollout)."""

