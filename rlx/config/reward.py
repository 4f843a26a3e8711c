"""The reward sections of the config beyond the rule reward: the reward model's serving keys (verl's
`reward_model.rollout.*`, `use_reward_loop`, `num_workers`) and verl 0.9.1's `reward.*` section, whose every key is
another spelling of a legacy key (`ALIASES`): `merge_reward_section` moves what a command sets there onto the legacy
key the code reads, and refuses a command that sets both spellings of one thing to different values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

ENGINE_ONLY = ("gpu_memory_utilization", "enforce_eager", "cudagraph_capture_sizes", "free_cache_engine",
               "data_parallel_size", "expert_parallel_size", "tensor_model_parallel_size", "max_num_batched_tokens",
               "max_num_seqs", "load_format", "engine_kwargs", "limit_images", "enable_chunked_prefill",
               "enable_prefix_caching", "disable_log_stats", "skip_tokenizer_init")
"""`reward_model.rollout.*` keys that tune the engine serving a reward model in verl (vLLM's batching, memory and
kernels); rlx scores a discriminative reward model with its FSDP worker, whose scores they do not change."""
JUDGE_ENGINE = ("gpu_memory_utilization", "enforce_eager", "free_cache_engine", "tensor_model_parallel_size",
                "max_num_batched_tokens", "max_num_seqs", "load_format", "engine_kwargs", "enable_chunked_prefill",
                "enable_prefix_caching", "disable_log_stats")
"""The ENGINE_ONLY keys the generative judge's vLLM engine takes (reward_model.judge.enable; rlx.workers.judge)."""


@dataclass
class RewardModelRolloutConfig:
    name: Optional[str] = None
    """The engine verl serves the reward model with: vllm | hf. A generative judge (reward_model.judge.enable)
    generates with it (null: the actor's rollout engine); a classifier is scored by rlx's FSDP worker either way
    (its output at the last token, what vLLM's classify returns). sglang and trtllm are refused."""
    dtype: Optional[str] = None
    """The reward model's dtype (bfloat16 | float16 | float32); null: reward_model.model.fsdp_config.model_dtype
    for a classifier, actor_rollout_ref.rollout.dtype for a judge on GPU (float32 on CPU)."""
    prompt_length: Optional[int] = None
    """A judge: the longest judging prompt, in the judge's tokens (a longer one keeps its last tokens; null: 2048,
    verl 0.9.1's). A classifier: with response_length, the longest conversation it reads (verl's serving
    max_model_len), when max_model_len and reward_model.max_length are null; a longer one keeps its last tokens."""
    response_length: Optional[int] = None
    """A judge: the longest verdict it writes (null: 2048, verl 0.9.1's). A classifier: see prompt_length."""
    max_model_len: Optional[int] = None
    """The longest conversation the reward model reads (a classifier, when reward_model.max_length is null; the
    judge's vLLM max_model_len, null: prompt_length + response_length)."""
    gpu_memory_utilization: Optional[float] = None
    """The judge's vLLM memory share of the GPU (null: 0.5, verl's); a classifier: inert."""
    enforce_eager: Optional[bool] = None
    """The judge's vLLM engine without CUDA graphs (null: True, verl's reward-model default); a classifier: inert."""
    cudagraph_capture_sizes: Any = None
    """Serving engine: CUDA-graph batch sizes (engine-only)."""
    free_cache_engine: Optional[bool] = None
    """The judge sleeps between scoring calls (vLLM sleep mode; the HF model on the CPU) (null: True); a classifier:
    inert (its parameters: reward_model.model.fsdp_config.param_offload)."""
    data_parallel_size: Optional[int] = None
    """Serving engine replicas (engine-only: the judge runs one engine per data-parallel group of ranks)."""
    expert_parallel_size: Optional[int] = None
    """Serving engine expert parallelism (engine-only)."""
    tensor_model_parallel_size: Optional[int] = None
    """The judge's vLLM tensor parallelism (null: 1; it must divide the GPUs); a classifier: inert (the FSDP worker
    shards over every GPU)."""
    max_num_batched_tokens: Optional[int] = None
    """The judge's vLLM batching (null: 8192); a classifier: inert (its budget: forward_max_token_len_per_gpu)."""
    max_num_seqs: Optional[int] = None
    """The judge's vLLM batching (null: 1024); a classifier: inert (its: micro_batch_size_per_gpu)."""
    load_format: Optional[str] = None
    """The judge's vLLM weight loading (null: auto, from reward_model.model.path; dummy formats are refused)."""
    engine_kwargs: Any = None
    """More vLLM engine arguments of the judge ({vllm: {...}} or flat); a classifier: inert."""
    limit_images: Any = None
    """Serving engine multimodal limit (engine-only)."""
    enable_chunked_prefill: Optional[bool] = None
    """The judge's vLLM chunked prefill (null: True); a classifier: inert."""
    enable_prefix_caching: Optional[bool] = None
    """The judge's vLLM prefix cache (null: vLLM's default); a classifier: inert."""
    disable_log_stats: Optional[bool] = None
    """The judge's vLLM statistics logging (null: off); a classifier: inert."""
    skip_tokenizer_init: Optional[bool] = None
    """Serving engine tokenizer (engine-only)."""


@dataclass
class RewardModuleConfig:
    path: Optional[str] = None
    """verl: a file defining a custom reward manager class (refused: rlx's managers are naive, dapo, batch)."""
    name: Optional[str] = None
    """verl: the custom reward manager class's name (refused with path)."""


@dataclass
class RewardManagerSection:
    source: Optional[str] = None
    """verl: register (a built-in manager by name) | importlib (a class from module.path; refused)."""
    name: Optional[str] = None
    """= reward_model.reward_manager."""
    module: RewardModuleConfig = field(default_factory=RewardModuleConfig)
    """verl: the custom reward manager class (refused)."""


@dataclass
class CustomRewardFunctionSection:
    path: Optional[str] = None
    """= custom_reward_function.path."""
    name: Optional[str] = None
    """= custom_reward_function.name."""


@dataclass
class RewardModelSection:
    enable: Optional[bool] = None
    """= reward_model.enable."""
    enable_resource_pool: Optional[bool] = None
    """= reward_model.enable_resource_pool."""
    n_gpus_per_node: Optional[int] = None
    """= reward_model.n_gpus_per_node."""
    nnodes: Optional[int] = None
    """= reward_model.nnodes."""
    model_path: Optional[str] = None
    """= reward_model.model.path."""
    rollout: RewardModelRolloutConfig = field(default_factory=RewardModelRolloutConfig)
    """= reward_model.rollout.*."""


@dataclass
class SandboxFusionConfig:
    url: Optional[str] = None
    """verl: a remote code-execution sandbox for code rewards (not supported: refused when set)."""
    max_concurrent: Optional[int] = None
    """verl: the sandbox's concurrent requests (with url; refused)."""
    memory_limit_mb: Optional[int] = None
    """verl: the sandbox's memory limit (with url; refused)."""


@dataclass
class RewardSection:
    num_workers: Optional[int] = None
    """= reward_model.num_workers."""
    reward_manager: RewardManagerSection = field(default_factory=RewardManagerSection)
    """= reward_model.reward_manager (name) and verl's custom manager keys."""
    custom_reward_function: CustomRewardFunctionSection = field(default_factory=CustomRewardFunctionSection)
    """= custom_reward_function.*."""
    reward_model: RewardModelSection = field(default_factory=RewardModelSection)
    """= reward_model.* (enable, model_path, rollout, the resource pool)."""
    reward_kwargs: dict = field(default_factory=dict)
    """= reward_model.reward_kwargs (when not empty)."""
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    """= sandbox_fusion.*."""


_ROLLOUT_KEYS = ("name", "dtype", "prompt_length", "response_length", "max_model_len") + ENGINE_ONLY
ALIASES: dict[str, str] = {
    "reward.num_workers": "reward_model.num_workers",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_manager.source": "reward_model.reward_loop_source",
    "reward.reward_manager.module.path": "reward_model.reward_loop_module_path",
    "reward.reward_manager.module.name": "reward_model.reward_loop_class_name",
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.enable_resource_pool": "reward_model.enable_resource_pool",
    "reward.reward_model.n_gpus_per_node": "reward_model.n_gpus_per_node",
    "reward.reward_model.nnodes": "reward_model.nnodes",
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.reward_kwargs": "reward_model.reward_kwargs",
    **{f"reward.reward_model.rollout.{k}": f"reward_model.rollout.{k}" for k in _ROLLOUT_KEYS},
    **{f"reward.sandbox_fusion.{k}": f"sandbox_fusion.{k}" for k in ("url", "max_concurrent", "memory_limit_mb")},
}
"""verl 0.9.1's `reward.*` keys and the legacy key each one is (verl's own migration maps them the same way)."""


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _set(obj, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, leaf, value)


def merge_reward_section(cfg, defaults) -> None:
    """Move every `reward.*` key the config sets (not None, not an empty dict) onto its legacy key, in place; a
    legacy key set to another value too (differing from `defaults`, the schema's own config) is a ValueError
    naming both."""
    conflicts = []
    for new, legacy in ALIASES.items():
        value = _get(cfg, new)
        if value is None or value == {}:
            continue
        current, default = _get(cfg, legacy), _get(defaults, legacy)
        if current != default and current != value:
            conflicts.append(f"{new}={value!r} and {legacy}={current!r} set one thing twice (verl 0.9.1's reward "
                             f"section and its legacy key). Fix: keep one of them.")
            continue
        _set(cfg, legacy, value)
    if conflicts:
        raise ValueError("Invalid rlx config:\n  - " + "\n  - ".join(conflicts))
