"""verl compatibility: the verl keys rlx accepts but does not implement (NOT_SUPPORTED, with NOT_SUPPORTED_REASONS),
its deprecated keys (DEPRECATED), keys that mirror another (FOLLOWS), keys that are no-ops by design
(NO_OP_BY_DESIGN) and the keys whose rlx default differs from verl's (VERL_DEFAULT_EXCEPTIONS).

Validation refuses a NOT_SUPPORTED key set to another value; tests/unit/test_config_keys.py walks the schema against these
tables; scripts/gen_docs.py renders them into docs/config_keys.md and docs/reference.md.
"""
from __future__ import annotations

from typing import Any

from rlx.config import profiler
from rlx.config.reward import ENGINE_ONLY, JUDGE_ENGINE
from rlx.config.rules import get_key, world_size


# verl keys that exist for compatibility but are not implemented: key -> the only accepted value.
NOT_SUPPORTED: dict[str, Any] = {
    "data.return_raw_input_ids": False,
    "data.return_full_prompt": False,
    "data.validation_shuffle": False,
    "data.image_key": "images",
    "data.video_key": "videos",
    "actor_rollout_ref.actor.use_prefix_grouper": False,
    "actor_rollout_ref.rollout.data_parallel_size": 1,
    "actor_rollout_ref.rollout.expert_parallel_size": 1,
    "actor_rollout_ref.rollout.trace.backend": None,
    "actor_rollout_ref.actor.fsdp_config.wrap_policy": {"min_num_params": 0},
    "actor_rollout_ref.actor.optim.total_training_steps": -1,
    "async_training.require_batches": 1,
    "rollout.total_rollout_steps": None,
    "rollout.test_freq": None,
    "actor_rollout_ref.ref.fsdp_config.wrap_policy": {"min_num_params": 0},
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": False,  # the ref has no optimizer
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": False,
    "actor_rollout_ref.rollout.agent.custom_async_server.path": None,
    "actor_rollout_ref.rollout.agent.custom_async_server.name": None,
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs": {},
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module": None,
    "critic.model.lora_rank": 0,
    "critic.model.lora_adapter_path": None,
    "critic.model.fsdp_config.wrap_policy": {"min_num_params": 0},
    "critic.optim.total_training_steps": -1,
    "reward_model.launch_reward_fn_async": False,
    "reward_model.reward_loop_source": None,
    "reward_model.reward_loop_module_path": None,
    "reward_model.reward_loop_class_name": None,
    "sandbox_fusion.url": None,
    "sandbox_fusion.max_concurrent": None,
    "sandbox_fusion.memory_limit_mb": None,
    "reward_model.model.fsdp_config.fsdp_size": -1,
    "reward_model.model.fsdp_config.wrap_policy": {"min_num_params": 0},
    "reward_model.model.fsdp_config.optimizer_offload": False,  # the reward model has no optimizer
    "trainer.default_hdfs_dir": None,
    "trainer.del_local_ckpt_after_load": False,
}
NOT_SUPPORTED.update(profiler.NOT_SUPPORTED)  # the torch profiler's schedule, vLLM's engine-side trace


# Why some NOT_SUPPORTED keys are refused (the validation error says it).
NOT_SUPPORTED_REASONS: dict[str, str] = {
    "async_training.require_batches":
        "verl's fully-async trainer updates on require_batches x ppo_mini_batch_size samples at a time; rlx's "
        "disaggregated trainer updates on data.train_batch_size prompts per step (set that instead)",
    "rollout.total_rollout_steps":
        "verl's fully-async rollouter counts the run in samples; rlx counts a disaggregated run in training steps "
        "(trainer.total_training_steps / total_epochs)",
    "rollout.test_freq":
        "verl's fully-async rollouter validates every this many syncs; rlx validates by trainer.test_freq",
    "actor_rollout_ref.actor.use_prefix_grouper":
        "verl's PrefixGrouper runs the prompt shared by a group's n responses once (a shared-prefix attention "
        "patch plus group-level batch balancing); rlx forwards each response with its own copy of the prompt, "
        "which computes the same log-probs, only with more compute",
    "actor_rollout_ref.rollout.data_parallel_size":
        "verl runs each rollout server on tp x dp GPUs with vLLM's data parallelism inside it; rlx runs one "
        "in-process vLLM engine per tensor-parallel group (world size / tensor_model_parallel_size engines, the "
        "layout verl has at dp=1), and vLLM's in-engine data parallelism (for expert parallelism) is not wired up; "
        "the rollout is already data-parallel over the tensor-parallel groups",
    "actor_rollout_ref.rollout.expert_parallel_size":
        "rlx's vLLM engines keep every expert of a mixture-of-experts model on each tensor-parallel group; vLLM's "
        "expert parallelism across a rollout server's tp x dp GPUs (verl's) is not wired up",
    "actor_rollout_ref.rollout.trace.backend":
        "verl sends each agent-loop trajectory to a tracing service (weave or mlflow); rlx has no rollout tracing. "
        "trainer.log_val_generations and the loggers record validation samples instead",
}

# verl's deprecated global batch-size keys -> the per-GPU key that replaces them. Taken as verl's workers take them
# (rlx.config.deprecated: divided by world size // sp, with a note); refused when the replacement is set too.
DEPRECATED: dict[str, str] = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size":
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size": "reward_model.micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size": "critic.forward_micro_batch_size_per_gpu",
}

# Keys that mirror another key (their default interpolates it) and must keep its value: rlx reads the other one.
FOLLOWS: dict[str, str] = {
    "actor_rollout_ref.rollout.prompt_length": "data.max_prompt_length",
    "actor_rollout_ref.rollout.response_length": "data.max_response_length",
}

_ORIG_PARAMS = ("FSDP1 bookkeeping only: rlx's FSDP1 always exposes the original parameters (use_orig_params=True, "
                "which LoRA's frozen and trained weights in one unit need); the flat-parameter view applies the same "
                "elementwise AdamW update to the same gradients (equal up to floating-point summation order, as "
                "FSDP1 and FSDP2 are); FSDP2 has no flat parameters (verl ignores it there)")
_ENGINE_STRATEGY = ("inert in verl too: its FSDP actor/critic config overwrites fsdp_config.strategy with the role's "
                    "strategy key, which picks FSDP1 or FSDP2 in rlx as in verl")

# verl keys that are accepted with any value and do nothing in rlx, each with the reason it is honest to accept
# them. Keep this short: a key that changes what verl computes is implemented or refused, never listed here.
NO_OP_BY_DESIGN: dict[str, str] = {
    "reward_model.use_reward_loop": "verl 0.9.1 serves every reward model through its reward loop, a classifier "
                                    "and a judge alike; rlx scores with its reward-model worker either way (the "
                                    "same last-token score; a judge is chosen by reward_model.judge.enable)",
    **{f"reward_model.rollout.{k}": "a knob of the engine serving the reward model in verl (batching, memory, "
                                    "kernels) that rlx's judge engine does not take; it changes no score"
       for k in ENGINE_ONLY if k not in JUDGE_ENGINE},
    "actor_rollout_ref.actor.fsdp_config.use_orig_params": _ORIG_PARAMS,
    "actor_rollout_ref.actor.fsdp_config.strategy": _ENGINE_STRATEGY,
    "actor_rollout_ref.ref.fsdp_config.use_orig_params": _ORIG_PARAMS,
    "actor_rollout_ref.ref.fsdp_config.strategy": _ENGINE_STRATEGY,
    "critic.model.fsdp_config.use_orig_params": _ORIG_PARAMS,
    "critic.model.fsdp_config.strategy": _ENGINE_STRATEGY,
    "reward_model.model.fsdp_config.use_orig_params": _ORIG_PARAMS,
    "reward_model.model.fsdp_config.strategy": _ENGINE_STRATEGY,
    "data.dataloader_num_workers": "loader speed only: rlx tokenizes every prompt once, up front, in the driver",
    "data.filter_overlong_prompts_workers": "speed only: the filter runs in the driver and drops the same prompts",
    "actor_rollout_ref.rollout.agent.num_workers": "speed only: verl's count of agent-loop processes; rlx runs every "
                                                   "trajectory of a rank concurrently in one event loop",
    "algorithm.filter_groups.max_inflight_gen_batches": "speed only: verl's V1 sampler generates that many prompt "
        "batches at once; rlx generates one round after the other and keeps the same groups",
    "actor_rollout_ref.actor.use_torch_compile": "speed only: rlx never compiles, whatever the value",
    "actor_rollout_ref.ref.use_torch_compile": "speed only: rlx never compiles, whatever the value",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "verl 0.9.1 reads it only for SGLang; with vLLM verl and rlx "
        "always wake the weights, sync, then wake the KV cache (the staged order this key asks for)",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": "sizes verl's transfer buffer "
        "to a vLLM server process; rlx's engine is in-process and loads each gathered tensor by reference (no "
        "buffer: the sync's peak is one parameter, or one layer with layered_summon)",
    # the critic's LoRA details are inert in verl too while its lora_rank is 0; that key is refused (NOT_SUPPORTED),
    # so verl scripts that pass lora_alpha/target_modules next to critic lora_rank=0 keep working.
    "critic.model.lora_alpha": "inert without critic.model.lora_rank > 0 (refused), as in verl",
    "critic.model.target_modules": "inert without critic.model.lora_rank > 0 (refused), as in verl",
    **{f"actor_rollout_ref.rollout.trace.{k}": "inert without actor_rollout_ref.rollout.trace.backend (refused), "
                                              "as in verl"
       for k in ("token2text", "max_samples_per_step_per_worker", "project_name", "experiment_name")},
    "trainer.use_legacy_worker_impl": "picks one of verl's two worker implementations, which train the same model; "
                                      "rlx has one (values other than verl's auto | enable | disable are refused)",
}
NO_OP_BY_DESIGN.update(profiler.NO_OP_BY_DESIGN)  # options of the refused nsys/npu tools; torch's stack depth


# The keys whose rlx default is not verl 0.9.1's (every other key shared with verl has verl's default; the test
# tests/unit/test_verl_defaults.py holds verl's values). Each one changes speed, memory or what is written to disk, never
# what is trained; docs/config_keys.md and docs/reference.md show this list (scripts/gen_docs.py). Values are
# {key: (rlx default, verl default, reason)}.
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
        "sync", "async", "both modes run (async: verl's agent loop, needed for multi-turn, which turns it on "
        "itself); for a single-turn rollout they sample the same distribution; sync stays the default until async is measured at least as "
        "fast on the GPU job"),
    "trainer.device": (
        "auto", "cuda", "auto is cuda when the driver sees a GPU (verl's value) and cpu otherwise, where verl cannot "
        "run at all"),
}


ACTOR_SP = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
CRITIC_SP = "critic.ulysses_sequence_parallel_size"
# deprecated key -> (the sp key verl divides by, or None: the role has no sequence parallelism; the key that says
# whether the role's micro-batches are by tokens)
DIVIDED_BY: dict[str, tuple[str | None, str]] = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": (ACTOR_SP, "actor_rollout_ref.actor.use_dynamic_bsz"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": (
        ACTOR_SP, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"),
    "actor_rollout_ref.ref.log_prob_micro_batch_size": (ACTOR_SP, "actor_rollout_ref.ref.log_prob_use_dynamic_bsz"),
    "critic.ppo_micro_batch_size": (CRITIC_SP, "critic.use_dynamic_bsz"),  # before forward_: its per-GPU key follows
    "critic.forward_micro_batch_size": (CRITIC_SP, "critic.use_dynamic_bsz"),
    "reward_model.micro_batch_size": (None, "reward_model.use_dynamic_bsz"),  # verl: divided by the world size
}
assert set(DIVIDED_BY) == set(DEPRECATED)  # every deprecated key says what verl divides it by


def data_parallel_size(world_size, sp) -> int | None:
    """verl's divisor: world size // sp (None when either is not a positive integer)."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (world_size, sp)):
        return None
    return max(world_size // sp, 1) if world_size >= sp else None


def check_not_supported(cfg, errors):
    for key, default in NOT_SUPPORTED.items():
        value = get_key(cfg, key)
        if value != default:
            why = f" ({NOT_SUPPORTED_REASONS[key]})" if key in NOT_SUPPORTED_REASONS else ""
            errors.append(f"{key}={value!r} is not supported yet by rlx{why}. Fix: remove it (or set {key}={default}).")
    for key, replacement in DEPRECATED.items():  # left set by rlx.config.deprecated: too small, or both set
        value, per_gpu = get_key(cfg, key), get_key(cfg, replacement)
        if value is None:
            continue
        sp_name = DIVIDED_BY[key][0]
        sp_key = sp_name or "(no sequence parallelism: 1)"
        sp, ws = get_key(cfg, sp_name) if sp_name else 1, world_size(cfg)
        dp = data_parallel_size(ws, sp)
        if value <= 0:
            errors.append(f"{key}={value} must be a positive integer (deprecated: verl's global micro-batch). Fix: "
                          f"{replacement}=<rows per GPU> instead.")
        elif dp is None:
            errors.append(f"{key}={value} (deprecated: verl's global micro-batch) is divided by world size // "
                          f"{sp_key} = {ws} // {sp!r}, which is not a positive data-parallel size. Fix: "
                          f"{replacement}=<rows per GPU> instead, and a {sp_key} that divides the world size.")
        elif value // dp < 1:
            errors.append(f"{key}={value} is deprecated (verl's global micro-batch): verl and rlx divide it by the "
                          f"{dp} data-parallel groups (world size {ws} // {sp_key}), which leaves 0 per GPU. Fix: "
                          f"{replacement}=<rows per GPU>, or {key} >= {dp}.")
        else:
            errors.append(f"{key}={value} and {replacement}={per_gpu} are both set (verl refuses this too). Fix: "
                          f"remove {key} (deprecated: verl's global micro-batch).")
    for key, source in FOLLOWS.items():
        value, wanted = get_key(cfg, key), get_key(cfg, source)
        if value != wanted:
            errors.append(f"{key}={value!r} differs from {source}={wanted!r}: rlx reads {source} (and {key} follows "
                          f"it). Fix: set {source}={value!r} and leave {key} out.")
