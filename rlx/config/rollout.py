"""`actor_rollout_ref.rollout`: the policy's generation engine, and its rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlx.config.agent import AgentLoopConfig, MultiTurnConfig
from rlx.config.profiler import RolloutProfilerConfig
from rlx.config.roles import ENGINES
from rlx.config.rules import check_choice, choice, world_size


ROLLOUT_NAMES = ("auto",) + ENGINES  # sglang: refused by name (_check_agent)
ROLLOUT_DTYPES = ("bfloat16", "float16", "float32")
LOAD_FORMATS = ("dummy_dtensor", "dummy", "auto", "safetensors", "pt")


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
    mode: str = choice("sync", ("sync", "async"))
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
    seed_each_sample: bool = True
    """rlx: seed every sample's sampling (the step's seed + its row), so each path (sync, agent loop, partial
    rollout) draws the same samples. False: vLLM's engine seed only (verl's way), and generation runs faster:
    vLLM samples seeded requests one by one (benchmarks/bench_rollout_engine.py, 512 requests of a 0.5B model on one
    H100: 13.4 ms per engine step seeded, 8.5 without)."""
    prompt_length: int = "${data.max_prompt_length}"  # type: ignore[assignment]
    """Follows data.max_prompt_length (any other value is an error: set data.max_prompt_length)."""
    response_length: int = "${data.max_response_length}"  # type: ignore[assignment]
    """Follows data.max_response_length (any other value is an error: set data.max_response_length)."""
    dtype: str = choice("bfloat16", ROLLOUT_DTYPES)
    """Rollout weights dtype on GPUs, vLLM and HF: bfloat16 | float16 | float32 (CPU runs use float32)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take (weights + KV cache)."""
    ignore_eos: bool = False
    """Keep generating past EOS: every response is max_response_length tokens (EOS tokens included, unmasked)."""
    enforce_eager: bool = False
    """Disable CUDA graphs in vLLM."""
    free_cache_engine: bool = True
    """Free the KV cache (vLLM sleep) between rollouts."""
    load_format: str = choice("dummy", LOAD_FORMATS)
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


def check_rollout(cfg, errors):
    r = cfg.actor_rollout_ref.rollout
    if r.name != "sglang":  # named in _check_agent
        check_choice(errors, "actor_rollout_ref.rollout.name", r.name, ROLLOUT_NAMES)
    # rollout.name=vllm without vLLM installed: rlx.trainer.probes
    greedy = (not r.do_sample) or r.temperature == 0
    if r.n > 1 and greedy:
        errors.append(f"actor_rollout_ref.rollout.n={r.n} with greedy sampling (do_sample={r.do_sample}, "
                      f"temperature={r.temperature}) gives n identical responses. Fix: "
                      f"actor_rollout_ref.rollout.do_sample=True and temperature > 0, or n=1.")
    ws = world_size(cfg)
    tp = r.tensor_model_parallel_size
    if tp < 1 or ws % tp:
        errors.append(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the world size {ws} "
                      f"(trainer.nnodes * trainer.n_gpus_per_node). Fix: a divisor of {ws}.")
    if tp > 1 and cfg.trainer.device == "cpu":
        errors.append(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} needs GPUs (trainer.device=cuda). "
                      f"Fix: actor_rollout_ref.rollout.tensor_model_parallel_size=1.")
    engine_kwargs = r.engine_kwargs or {}
    if "vllm" in engine_kwargs:  # verl's layout {vllm: {...}, sglang: {...}}: rlx's engine is vLLM
        for other in sorted(set(engine_kwargs) - {"vllm"}):
            value = engine_kwargs[other]
            if not isinstance(value, dict) or any(v is not None for v in value.values()):
                errors.append(f"actor_rollout_ref.rollout.engine_kwargs.{other}={value!r} configures another engine; "
                              f"rlx's rollout engine is vLLM. Fix: remove it, or move its keys under "
                              f"actor_rollout_ref.rollout.engine_kwargs.vllm.")
    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    if r.max_model_len is not None and r.max_model_len < need:
        errors.append(f"actor_rollout_ref.rollout.max_model_len={r.max_model_len} is smaller than data.max_prompt_length"
                      f" + data.max_response_length = {need}. Fix: actor_rollout_ref.rollout.max_model_len={need} "
                      f"(or null), or shorter lengths.")
