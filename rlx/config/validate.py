"""Every cross-key rule, in one place. Runs on the driver before Ray starts.

Each rule adds a message naming the keys, the bad values and the fix; all problems are reported together
in one ValueError so a user fixes a command line in one go.
"""
from __future__ import annotations

import importlib.util
import json
import os

from rlx.algos.advantages import ADV_ESTIMATORS
from rlx.algos.core_algos import KL_CTRL_TYPES, KL_PENALTY_TYPES as KL_TYPES, LOSS_AGG_MODES
from rlx.algos.policy_losses import LOSS_MODES
from rlx.config.async_training import check_async_training
from rlx.config.deprecated import DIVIDED_BY, data_parallel_size
from rlx.config.profiler import TORCH_CONTENTS
from rlx.config.schema import RLXConfig
from rlx.config.verl_compat import DEPRECATED, FOLLOWS, NOT_SUPPORTED, NOT_SUPPORTED_REASONS
from rlx.config.roles import ENGINES, plan_roles, reward_model_pool, vllm_missing

STRATEGIES = ("fsdp", "fsdp2")
VERL_ENGINE_STRATEGIES = ("fsdp", "fsdp2", "fsdp_turbo")  # the values verl's FSDP engine config accepts
ROLLOUT_NAMES = ("auto",) + ENGINES  # sglang: refused by name (_check_agent)
TRUNCATIONS = ("error", "left", "right", "middle")
LOGGERS = ("console", "file", "tensorboard", "wandb", "swanlab")
MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")
DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
ROLLOUT_DTYPES = ("bfloat16", "float16", "float32")
LOAD_FORMATS = ("dummy_dtensor", "dummy", "auto", "safetensors", "pt")
REWARD_MANAGERS = ("naive", "dapo", "batch")
OVERLONG_BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")
PROFILER_TOOLS = (None, "torch", "torch_memory")
REFUSED_PROFILER_TOOLS = {
    "nsys": "NVIDIA Nsight Systems needs the workers started under nsys (verl's Ray runtime-env hook), which rlx does "
            "not do; for GPU kernels and timelines use global_profiler.tool=torch (its traces hold the CUDA kernels)",
    "npu": "Ascend NPUs are not a device rlx runs on",
    "precision_debugger": "msprobe's precision debugger is Ascend tooling rlx does not integrate",
}
LEGACY_WORKER_IMPL = ("auto", "enable", "disable")  # verl's values (any other is verl's ValueError too)


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _choice(errors, key, value, choices):
    if value not in choices:
        errors.append(f"{key}={value!r} is not valid; choose one of {list(choices)}. Fix: {key}=<one of them>.")


def world_size(cfg: RLXConfig) -> int:
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def num_hidden_layers(model_path: str) -> int | None:
    """Layer count from the model's config.json (materialises a built-in model on first use)."""
    from rlx.models import resolve_model_path

    path = os.path.join(resolve_model_path(model_path), "config.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("num_hidden_layers")


def model_config(model) -> dict:
    """The model's config.json (materialises a built-in model on first use) with `override_config` applied."""
    from rlx.models import resolve_model_path

    path = os.path.join(resolve_model_path(model.path), "config.json")
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            out = json.load(f)
    return {**out, **(model.override_config or {})}


SP_ROLES = (("actor_rollout_ref.actor", "actor_rollout_ref.model"),
            ("actor_rollout_ref.ref", "actor_rollout_ref.model"), ("critic", "critic.model"))


def _built_roles(cfg):
    """(role key, model key prefix) of each role the job builds: the actor, the ref with a KL term, the critic
    with GAE."""
    roles = plan_roles(cfg)
    for role, model_prefix in SP_ROLES:
        if role == "actor_rollout_ref.ref" and not roles.ref:
            continue
        if role == "critic" and not roles.critic:
            continue
        yield role, model_prefix


def _sp_roles(cfg):
    """(sp key, sp, model key prefix, model config) of each role that is built with sp > 1."""
    for role, model_prefix in _built_roles(cfg):
        yield f"{role}.ulysses_sequence_parallel_size", _get(cfg, f"{role}.ulysses_sequence_parallel_size"), \
            model_prefix, _get(cfg, model_prefix)


def _check_sequence_parallel(cfg, errors):
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
        conf = model_config(model)
        heads = conf.get("num_attention_heads")
        if heads is None:
            continue
        problem = sp_heads_problem(key, sp, heads, conf.get("num_key_value_heads"), f"{prefix}.path={model.path!r}")
        if problem:
            errors.append(problem)


def _check_timeout(cfg, errors):
    t = cfg.actor_rollout_ref.nccl_timeout
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
        errors.append(f"actor_rollout_ref.nccl_timeout={t!r} must be a positive number of seconds (verl's default: "
                      f"600). Fix: actor_rollout_ref.nccl_timeout=600.")


def _check_kernels(cfg, errors):
    """Liger's Triton kernels need a GPU and the liger-kernel package."""
    for role, prefix in _built_roles(cfg):
        if role == "actor_rollout_ref.ref":
            continue  # the policy's model key: said once for the actor
        key = f"{prefix}.use_liger"
        if not _get(cfg, key):
            continue
        if cfg.trainer.device == "cpu":
            errors.append(f"{key}=True runs Liger's Triton kernels, which need a GPU, but trainer.device=cpu. "
                          f"Fix: {key}=False, or trainer.device=cuda.")
        elif importlib.util.find_spec("liger_kernel") is None:
            errors.append(f"{key}=True needs the liger-kernel package. Fix: pip install liger-kernel, or {key}=False.")


def _check_fsdp_size(cfg, errors):
    """Hybrid sharding: `fsdp_size` ranks per replica must split the world evenly (verl's meaning; -1 or a size of
    at least the world shards over all ranks)."""
    ws = world_size(cfg)
    for role, _ in _built_roles(cfg):
        key = f"{role}.fsdp_config.fsdp_size" if role != "critic" else "critic.model.fsdp_config.fsdp_size"
        n = _get(cfg, key)
        if not isinstance(n, int) or isinstance(n, bool):
            errors.append(f"{key}={n!r} must be an integer: -1 (shard over all ranks) or a divisor of the world size. "
                          f"Fix: {key}=-1.")
        elif n == 0 or (0 < n < ws and ws % n):
            errors.append(f"{key}={n} must divide the world size {ws} (trainer.nnodes * trainer.n_gpus_per_node): "
                          f"the ranks split into replicas of {key} ranks that each shard the model (hybrid sharding). "
                          f"Fix: {key} among the divisors of {ws} (e.g. trainer.n_gpus_per_node), or {key}=-1.")


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


def _check_not_supported(cfg, errors):
    for key, default in NOT_SUPPORTED.items():
        value = _get(cfg, key)
        if value != default:
            why = f" ({NOT_SUPPORTED_REASONS[key]})" if key in NOT_SUPPORTED_REASONS else ""
            errors.append(f"{key}={value!r} is not supported yet by rlx{why}. Fix: remove it (or set {key}={default}).")
    for key, replacement in DEPRECATED.items():  # left set by rlx.config.deprecated: too small, or both set
        value, per_gpu = _get(cfg, key), _get(cfg, replacement)
        if value is None:
            continue
        sp_key = DIVIDED_BY[key][0] or "(no sequence parallelism: 1)"
        sp, ws = _get(cfg, DIVIDED_BY[key][0]) if DIVIDED_BY[key][0] else 1, world_size(cfg)
        dp = data_parallel_size(ws, sp)
        if dp is None:
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
        value, wanted = _get(cfg, key), _get(cfg, source)
        if value != wanted:
            errors.append(f"{key}={value!r} differs from {source}={wanted!r}: rlx reads {source} (and {key} follows "
                          f"it). Fix: set {source}={value!r} and leave {key} out.")


def _check_offload(cfg, errors):
    for role, model, strategy_key in (
        ("actor", cfg.actor_rollout_ref.model, "actor_rollout_ref.actor.strategy"),
        ("critic", cfg.critic.model, "critic.strategy"),
    ):
        if not model.enable_activation_offload:
            continue
        prefix = "actor_rollout_ref.model" if role == "actor" else "critic.model"
        strategy = _get(cfg, strategy_key)
        if strategy not in STRATEGIES:
            errors.append(f"{prefix}.enable_activation_offload=True requires {strategy_key} to be fsdp or fsdp2, "
                          f"got {strategy_key}={strategy!r}. Fix: set {strategy_key}=fsdp2, or "
                          f"{prefix}.enable_activation_offload=False.")
            continue
        if role == "critic" and not plan_roles(cfg).critic:
            continue  # no critic is built
        layers = model.override_config.get("num_hidden_layers") or num_hidden_layers(model.path)
        if layers is not None and layers < 3:
            errors.append(f"{prefix}.enable_activation_offload=True needs a model with at least 3 decoder layers "
                          f"({prefix}.path={model.path!r} has {layers}). Fix: "
                          f"{prefix}.enable_activation_offload=False.")


def _check_strategies(cfg, errors):
    for key in ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy"):
        value = _get(cfg, key)
        if value not in STRATEGIES:
            errors.append(f"{key}={value!r} is not supported; rlx trains with fsdp or fsdp2. Fix: {key}=fsdp2.")
    for strategy_key, prefix in (("actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.fsdp_config"),
                                 ("actor_rollout_ref.ref.strategy", "actor_rollout_ref.ref.fsdp_config"),
                                 ("critic.strategy", "critic.model.fsdp_config")):
        engine_strategy = _get(cfg, f"{prefix}.strategy")  # verl replaces it by the role's strategy: only checked
        if engine_strategy not in VERL_ENGINE_STRATEGIES:
            errors.append(f"{prefix}.strategy={engine_strategy!r} is not one of verl's {list(VERL_ENGINE_STRATEGIES)} "
                          f"(verl overwrites it with {strategy_key}, which picks FSDP1 or FSDP2). Fix: drop it, or "
                          f"set {strategy_key}.")
        if _get(cfg, strategy_key) == "fsdp" and _get(cfg, f"{prefix}.offload_policy"):
            errors.append(f"{prefix}.offload_policy=True is FSDP2's CPUOffloadPolicy, but {strategy_key}=fsdp. Fix: "
                          f"{strategy_key}=fsdp2, or {prefix}.param_offload=True (both strategies) instead.")


def _check_batch_sizes(cfg, errors):
    ws = world_size(cfg)
    n = cfg.actor_rollout_ref.rollout.n
    tbs = cfg.data.train_batch_size
    if ws < 1:
        errors.append(f"trainer.nnodes * trainer.n_gpus_per_node must be >= 1, got {ws}. Fix: trainer.nnodes=1 "
                      f"trainer.n_gpus_per_node=<GPUs (or CPU workers) per node>.")
        return
    if (tbs * n) % ws:
        errors.append(f"data.train_batch_size * actor_rollout_ref.rollout.n = {tbs}*{n} = {tbs * n} sequences do not "
                      f"divide across world size {ws} (trainer.nnodes * trainer.n_gpus_per_node). Fix: choose sizes so "
                      f"that it divides.")
    built = plan_roles(cfg)
    roles = [("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor)]
    if built.critic:
        roles.append(("critic", cfg.critic))
    for prefix, role in roles:
        mini, micro = role.ppo_mini_batch_size, role.ppo_micro_batch_size_per_gpu
        if mini <= 0 or tbs % mini:
            errors.append(f"{prefix}.ppo_mini_batch_size={mini} must be positive and divide data.train_batch_size="
                          f"{tbs}. Fix: {prefix}.ppo_mini_batch_size among the divisors of {tbs}.")
            continue
        sp = role.ulysses_sequence_parallel_size
        # the ranks of a sequence-parallel group share rows: a mini-batch splits over world / sp groups
        dp = ws // sp if isinstance(sp, int) and sp >= 1 and ws % sp == 0 else ws
        if (mini * n) % dp:
            where = f"world size {ws}" if dp == ws else f"{dp} data-parallel groups (world size {ws} / {sp})"
            errors.append(f"{prefix}.ppo_mini_batch_size * rollout.n = {mini}*{n} = {mini * n} sequences must divide "
                          f"across {where}. Fix: change {prefix}.ppo_mini_batch_size or trainer.n_gpus_per_node.")
            continue
        # micro-batches need not divide the mini-batch (the last one may be smaller; gradients stay exact)
        if role.use_dynamic_bsz:
            _positive(errors, f"{prefix}.ppo_max_token_len_per_gpu", role.ppo_max_token_len_per_gpu,
                      f"(the token budget of {prefix}.use_dynamic_bsz=True)")
        elif micro is None or micro <= 0:
            errors.append(f"{prefix}.ppo_micro_batch_size_per_gpu={micro!r} must be a positive integer. Fix: set it "
                          f"(e.g. 4), or {prefix}.use_dynamic_bsz=True with {prefix}.ppo_max_token_len_per_gpu.")
    log_prob_roles = [("actor_rollout_ref.rollout", "log_prob_use_dynamic_bsz")]
    if built.ref:  # (as verl asks)
        log_prob_roles.append(("actor_rollout_ref.ref", "log_prob_use_dynamic_bsz"))
    for prefix, dyn in log_prob_roles:
        if _get(cfg, f"{prefix}.{dyn}"):
            _positive(errors, f"{prefix}.log_prob_max_token_len_per_gpu",
                      _get(cfg, f"{prefix}.log_prob_max_token_len_per_gpu"), f"(the token budget of {prefix}.{dyn})")
            continue
        key = f"{prefix}.log_prob_micro_batch_size_per_gpu"
        value = _get(cfg, key)
        if value is None or value <= 0:
            errors.append(f"{key}={value!r} must be a positive integer. Fix: set it (e.g. 8), or {prefix}.{dyn}=True.")
    if built.critic:
        c = cfg.critic
        if c.use_dynamic_bsz:
            _positive(errors, "critic.forward_max_token_len_per_gpu", c.forward_max_token_len_per_gpu,
                      "(the token budget of critic.use_dynamic_bsz=True)")
        elif c.forward_micro_batch_size_per_gpu is None or c.forward_micro_batch_size_per_gpu <= 0:
            errors.append(f"critic.forward_micro_batch_size_per_gpu={c.forward_micro_batch_size_per_gpu!r} must be a "
                          f"positive integer. Fix: set it (e.g. 8), or critic.use_dynamic_bsz=True.")


def _positive(errors, key, value, what=""):
    if value is None or value <= 0:
        errors.append(f"{key}={value!r} must be a positive integer {what}. Fix: {key}=<a positive "
                      f"integer>.".replace(" .", "."))


def _check_head_backend(cfg, errors):
    """fused_kernel_options.impl_backend: torch | triton; triton needs the package and a GPU (or the interpreter)."""
    from rlx.config.device import FUSED_HEAD_BACKEND_KEY, triton_head_problem

    model = cfg.actor_rollout_ref.model
    backend = model.fused_kernel_options.impl_backend
    _choice(errors, FUSED_HEAD_BACKEND_KEY, backend, ("torch", "triton"))
    if backend == "triton" and model.use_fused_kernels:  # the unfused head has no backend (as in verl)
        problem = triton_head_problem(cfg.trainer.device)
        if problem:
            errors.append(problem)


def _check_long_sequences(cfg, errors):
    """The fused head's chunk and the MLP tile sizes."""
    model = cfg.actor_rollout_ref.model
    if model.use_fused_kernels:
        _positive(errors, "actor_rollout_ref.model.fused_kernel_options.chunk_size",
                  model.fused_kernel_options.chunk_size, "(tokens per chunk of the fused head)")
    _check_head_backend(cfg, errors)
    for role in ("actor", "ref"):  # the unfused head's chunked entropy
        if _get(cfg, f"actor_rollout_ref.{role}.entropy_from_logits_with_chunking"):
            key = f"actor_rollout_ref.{role}.entropy_from_logits_chunk_size"
            _positive(errors, key, _get(cfg, key), "(rows per chunk of the entropy)")
    for prefix in ("actor_rollout_ref.model", "critic.model"):
        tile = _get(cfg, f"{prefix}.tile_mlp_tokens")
        if tile < 0:
            errors.append(f"{prefix}.tile_mlp_tokens={tile} must be >= 0 (0 turns MLP tiling off). Fix: "
                          f"{prefix}.tile_mlp_tokens=0.")
        elif tile and _get(cfg, f"{prefix}.activation_offload.recompute_mlp"):
            errors.append(f"{prefix}.tile_mlp_tokens={tile} and {prefix}.activation_offload.recompute_mlp=True both "
                          f"replace the MLP's forward (tiling also recomputes the MLP in backward). Fix: "
                          f"{prefix}.activation_offload.recompute_mlp=False, or {prefix}.tile_mlp_tokens=0.")
        layer = _get(cfg, f"{prefix}.tile_layer_tokens")
        if layer < 0:
            errors.append(f"{prefix}.tile_layer_tokens={layer} must be >= 0 (0 turns layer tiling off). Fix: "
                          f"{prefix}.tile_layer_tokens=0.")
        elif layer and not _get(cfg, f"{prefix}.enable_gradient_checkpointing"):
            errors.append(f"{prefix}.tile_layer_tokens={layer} recomputes each decoder layer in backward (a tiled "
                          f"form of checkpointing). Fix: {prefix}.enable_gradient_checkpointing=True, or "
                          f"{prefix}.tile_layer_tokens=0.")


def model_module_names(model_path: str, trust_remote_code: bool = False) -> list[tuple[str, str]] | None:
    """`(name, class name)` of every module of the causal LM at `model_path`, built on the meta device (no weights
    read, no memory); None when the path has no config.json."""
    from rlx.models import resolve_model_path

    path = resolve_model_path(model_path)
    if not os.path.exists(os.path.join(path, "config.json")):
        return None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return [(n, type(m).__name__) for n, m in model.named_modules()]


def _check_lora(cfg, errors):
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
        _check_lora_dtype(cfg, key, "lora_adapter_path", errors)
        return
    if rank == 0:
        return
    if not isinstance(model.lora_alpha, (int, float)) or isinstance(model.lora_alpha, bool) or model.lora_alpha <= 0:
        errors.append(f"{key}.lora_alpha={model.lora_alpha!r} must be a positive number (the adapters are scaled "
                      f"by lora_alpha / lora_rank). Fix: {key}.lora_alpha={2 * rank}.")
    lists = {}
    for k in ("target_modules", "exclude_modules"):
        v = _get(model, k)
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
    if lists:
        try:
            names = model_module_names(model.path, model.trust_remote_code)
        except Exception:  # noqa: BLE001 - an unreadable model is the preflight's to report
            names = None
        if names is not None:
            linear = sorted({n.rsplit(".", 1)[-1] for n, c in names if c == "Linear"})
            for k, listed in lists.items():
                missing = [t for t in listed if not any(n == t or n.endswith("." + t) for n, _ in names)]
                if missing:
                    errors.append(f"{key}.{k}={listed}: {missing} name no module of {model.path}; its linear modules "
                                  f"are {linear}. Fix: name some of them, or {key}.target_modules=all-linear.")
    _check_lora_dtype(cfg, key, f"lora_rank={rank}", errors)


def _check_lora_dtype(cfg, key, what, errors):
    strategy = cfg.actor_rollout_ref.actor.strategy
    if strategy == "fsdp" and cfg.actor_rollout_ref.actor.fsdp_config.model_dtype not in ("fp32", "float32"):
        errors.append(f"{key}.{what} with actor.strategy=fsdp and actor.fsdp_config.model_dtype="
                      f"{cfg.actor_rollout_ref.actor.fsdp_config.model_dtype}: FSDP1 flattens a layer's frozen base "
                      f"and its fp32 adapters into one buffer of one dtype. Fix: actor.strategy=fsdp2 (a bf16 base "
                      f"with fp32 adapters), or actor.fsdp_config.model_dtype=fp32.")


def _check_algorithm(cfg, errors):
    alg, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    _choice(errors, "algorithm.adv_estimator", alg.adv_estimator, ADV_ESTIMATORS)
    if rollout.n < 1:
        errors.append(f"actor_rollout_ref.rollout.n={rollout.n} must be >= 1 (responses per prompt). Fix: "
                      f"actor_rollout_ref.rollout.n=1 (PPO), or >= 2 for the group estimators (grpo, rloo, ...).")
    elif alg.adv_estimator == "grpo_passk" and rollout.n < 2:  # verl raises for a group of one at the first step
        errors.append(f"algorithm.adv_estimator=grpo_passk takes the best two responses of each group and needs "
                      f"actor_rollout_ref.rollout.n >= 2, got {rollout.n}. Fix: actor_rollout_ref.rollout.n=4 "
                      f"(or algorithm.adv_estimator=grpo).")
    _choice(errors, "actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
    _choice(errors, "actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, KL_TYPES)
    _choice(errors, "algorithm.kl_penalty", alg.kl_penalty, KL_TYPES)
    _choice(errors, "algorithm.kl_ctrl.type", alg.kl_ctrl.type, KL_CTRL_TYPES)
    if plan_roles(cfg).critic:
        _choice(errors, "critic.loss_agg_mode", cfg.critic.loss_agg_mode, LOSS_AGG_MODES)
    if actor.clip_ratio_c <= 1.0:
        errors.append(f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1 (dual clip). Fix: "
                      f"actor_rollout_ref.actor.clip_ratio_c=3.0 (verl's default).")
    _check_policy_loss(cfg, errors)
    _check_estimator_inputs(cfg, errors)


def _check_policy_loss(cfg, errors):
    actor = cfg.actor_rollout_ref.actor
    pl, key = actor.policy_loss, "actor_rollout_ref.actor.policy_loss"
    _choice(errors, f"{key}.loss_mode", pl.loss_mode, LOSS_MODES)
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


def _check_estimator_inputs(cfg, errors):
    """What an estimator reads beyond the rewards: sum_pi_squared (optimal token baseline), reward components
    (gdpo)."""
    alg, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    if alg.adv_estimator in ("optimal_token_baseline", "tir_optimal_token_baseline") \
            and not actor.calculate_sum_pi_squared:
        errors.append(f"algorithm.adv_estimator={alg.adv_estimator} reads sum_pi_squared from the actor. Fix: "
                      f"actor_rollout_ref.actor.calculate_sum_pi_squared=True.")
    if alg.adv_estimator == "gdpo" and not alg.gdpo_reward_keys:
        errors.append("algorithm.adv_estimator=gdpo normalises each reward component on its own and needs their "
                      "names. Fix: algorithm.gdpo_reward_keys=[format_reward,accuracy_reward] (keys of the dict "
                      "your reward function returns).")
    weights = alg.gdpo_reward_weights
    if weights is not None and len(weights) != len(alg.gdpo_reward_keys or []):
        errors.append(f"algorithm.gdpo_reward_weights={list(weights)} needs one weight per "
                      f"algorithm.gdpo_reward_keys entry ({list(alg.gdpo_reward_keys or [])}). Fix: one weight per "
                      f"key, or algorithm.gdpo_reward_weights=null (1 each).")
    for key in ("actor_rollout_ref.actor.optim.warmup_style", "critic.optim.warmup_style"):
        _choice(errors, key, _get(cfg, key), ("constant", "cosine"))


def _check_rollout(cfg, errors):
    r = cfg.actor_rollout_ref.rollout
    if r.name != "sglang":  # named in _check_agent
        _choice(errors, "actor_rollout_ref.rollout.name", r.name, ROLLOUT_NAMES)
    if vllm_missing(r.name):
        from rlx.config.device import VLLM_INSTALL_HINT
        errors.append(f"actor_rollout_ref.rollout.name=vllm but vLLM is not installed. {VLLM_INSTALL_HINT} "
                      f"Fix: install it as above, or actor_rollout_ref.rollout.name=hf.")
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
    _choice(errors, "actor_rollout_ref.rollout.dtype", r.dtype, ROLLOUT_DTYPES)
    _choice(errors, "actor_rollout_ref.rollout.load_format", r.load_format, LOAD_FORMATS)
    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    if r.max_model_len is not None and r.max_model_len < need:
        errors.append(f"actor_rollout_ref.rollout.max_model_len={r.max_model_len} is smaller than data.max_prompt_length"
                      f" + data.max_response_length = {need}. Fix: actor_rollout_ref.rollout.max_model_len={need} "
                      f"(or null), or shorter lengths.")


def _check_reward_pool(cfg, errors):
    """reward_model.enable_resource_pool: both sizes of the pool given, as verl requires them."""
    rm = cfg.reward_model
    if not rm.enable_resource_pool:
        return
    for key, value in (("reward_model.nnodes", rm.nnodes), ("reward_model.n_gpus_per_node", rm.n_gpus_per_node)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            errors.append(f"{key}={value!r}: reward_model.enable_resource_pool=True places the reward model on a pool "
                          f"of its own, reward_model.nnodes x reward_model.n_gpus_per_node GPUs (verl requires both "
                          f"> 0). Fix: {key}=<a positive count>, or reward_model.enable_resource_pool=False "
                          f"(colocated with the actor).")


def _check_reward_model(cfg, errors):
    """reward_model.enable: a model to score with, a strategy, and a micro-batch size (or a token budget)."""
    _check_reward_pool(cfg, errors)
    rm = cfg.reward_model
    if not rm.enable:
        return
    if not rm.model.path:
        errors.append("reward_model.enable=True needs reward_model.model.path=<a sequence-classification model dir> "
                      "(or builtin://tiny-qwen2-rm; a causal LM with reward_model.judge.enable=True). Fix: set it, or "
                      "reward_model.enable=False.")
    if rm.strategy not in STRATEGIES:
        errors.append(f"reward_model.strategy={rm.strategy!r} is not supported; the reward model is sharded with fsdp "
                      f"or fsdp2. Fix: reward_model.strategy=fsdp2.")
    if rm.use_dynamic_bsz:
        _positive(errors, "reward_model.forward_max_token_len_per_gpu", rm.forward_max_token_len_per_gpu,
                  "(the token budget of reward_model.use_dynamic_bsz=True)")
    elif rm.micro_batch_size_per_gpu is None and rm.micro_batch_size is None:  # verl 0.9.1: no such key
        _positive(errors, "reward_model.forward_max_token_len_per_gpu", rm.forward_max_token_len_per_gpu,
                  "(the token budget of the reward model's micro-batches when reward_model.micro_batch_size_per_gpu "
                  "is null)")
    elif (rm.micro_batch_size_per_gpu or rm.micro_batch_size) <= 0:
        errors.append(f"reward_model.micro_batch_size_per_gpu={rm.micro_batch_size_per_gpu!r} must be positive. Fix: "
                      f"reward_model.micro_batch_size_per_gpu=<rows per GPU>.")
    name = rm.rollout.name
    if name is not None and name not in ENGINES:
        errors.append(f"reward_model.rollout.name={name!r}: rlx scores a reward model with its FSDP worker (the "
                      f"classifier's last-token output, what vLLM's classify returns) or generates a judge's "
                      f"verdicts with vLLM or HF; sglang and trtllm are not supported. Fix: "
                      f"reward_model.rollout.name=vllm (or hf, or leave it out).")
    if rm.rollout.dtype is not None:
        _choice(errors, "reward_model.rollout.dtype", rm.rollout.dtype, ROLLOUT_DTYPES)
    if rm.max_length is not None and rm.max_length <= 0:
        errors.append(f"reward_model.max_length={rm.max_length} must be positive (or null). Fix: "
                      f"reward_model.max_length=null.")
def _check_judge(cfg, errors):
    """reward_model.judge.*: a generative reward model needs the reward model on, a template with the fields it
    fills, a score range, and an engine that can serve it."""
    from rlx.config.judge import REQUIRED_FIELDS, TEMPLATE_FIELDS, template_fields

    rm, j = cfg.reward_model, cfg.reward_model.judge
    if not j.enable:
        return
    if not rm.enable:
        errors.append("reward_model.judge.enable=True needs reward_model.enable=True (the judge is the reward "
                      "model). Fix: add reward_model.enable=True, or drop reward_model.judge.enable.")
    if j.prompt_template is not None:
        try:
            fields = template_fields(j.prompt_template)
        except ValueError as e:
            fields = None
            errors.append(f"reward_model.judge.prompt_template cannot be read as a str.format template ({e}). Fix: "
                          f"write a literal brace twice ({{{{ or }}}}).")
        if fields is not None:
            unknown = sorted({f for f in fields if f not in TEMPLATE_FIELDS})
            missing = [f for f in REQUIRED_FIELDS if f not in fields]
            if unknown:
                errors.append(f"reward_model.judge.prompt_template names {unknown}, which rlx does not fill. Fix: use "
                              f"only {list(TEMPLATE_FIELDS)} (a literal brace is written twice).")
            if missing:
                errors.append(f"reward_model.judge.prompt_template has no {missing} field(s): the judge would not see "
                              f"{' and '.join(missing)}. Fix: add " + " and ".join("{" + f + "}" for f in missing)
                              + ".")
    if rm.model.override_config:
        errors.append(f"reward_model.model.override_config={dict(rm.model.override_config)!r} is applied to a "
                      f"classifier only; the judge is loaded as its checkpoint stands. Fix: drop it (or bake the "
                      f"change into the judge's config.json).")
    if not j.min_score < j.max_score:
        errors.append(f"reward_model.judge.min_score={j.min_score} must be below reward_model.judge.max_score="
                      f"{j.max_score}. Fix: give the score range the template asks for.")
    if j.do_sample and j.temperature <= 0:
        errors.append(f"reward_model.judge.temperature={j.temperature} must be positive with "
                      f"reward_model.judge.do_sample=True. Fix: a positive temperature, or do_sample=False (greedy).")
    if not 0 < j.top_p <= 1:
        errors.append(f"reward_model.judge.top_p={j.top_p} must be in (0, 1]. Fix: reward_model.judge.top_p=1.0.")
    r = rm.rollout
    for key in ("prompt_length", "response_length"):
        if getattr(r, key) is not None and getattr(r, key) <= 0:
            errors.append(f"reward_model.rollout.{key}={getattr(r, key)} must be positive (or null: 2048).")
    if vllm_missing(r.name or cfg.actor_rollout_ref.rollout.name):
        from rlx.config.device import VLLM_INSTALL_HINT
        errors.append(f"the judge generates with vLLM (reward_model.rollout.name={r.name!r}, "
                      f"actor_rollout_ref.rollout.name={cfg.actor_rollout_ref.rollout.name!r}) but vLLM is not "
                      f"installed. {VLLM_INSTALL_HINT} Fix: install it as above, or reward_model.rollout.name=hf.")
    if r.load_format is not None and str(r.load_format).startswith("dummy"):
        errors.append(f"reward_model.rollout.load_format={r.load_format!r} gives the judge random weights (nothing "
                      f"is synced into it). Fix: reward_model.rollout.load_format=auto (or leave it out).")
    tp, gpus = r.tensor_model_parallel_size or 1, cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    if tp < 1 or gpus % tp:
        errors.append(f"reward_model.rollout.tensor_model_parallel_size={tp} must divide the reward model's GPUs "
                      f"(trainer.n_gpus_per_node * trainer.nnodes = {gpus}). Fix: a divisor of {gpus}.")
    elif tp > 1 and cfg.trainer.device == "cpu":
        errors.append(f"reward_model.rollout.tensor_model_parallel_size={tp} needs GPUs; on CPU every rank runs its "
                      f"own judge. Fix: reward_model.rollout.tensor_model_parallel_size=1.")
    need = (r.prompt_length or 2048) + (r.response_length or 2048)
    if r.max_model_len is not None and r.max_model_len < need:
        errors.append(f"reward_model.rollout.max_model_len={r.max_model_len} is smaller than the judge's "
                      f"reward_model.rollout.prompt_length + response_length = {need}. Fix: raise it, or shorten them.")


AGENT_LOOPS = ("single_turn_agent", "tool_agent")  # the built-in ones (rlx.workers.rollout.agent)
TOOL_FORMATS = ("hermes",)
TRUNCATE_SIDES = ("left", "middle", "right")
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")


def _check_agent(cfg, errors):
    """rollout.mode, rollout.agent.* and rollout.multi_turn.* (docs/agent.md)."""
    from rlx.config.agent import uses_agent_loop

    r, key = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    if r.name == "sglang":
        errors.append(f"{key}.name=sglang: rlx serves vLLM (and HF generate), not SGLang; verl's multi-turn configs "
                      f"run on vLLM here with the same keys. Fix: {key}.name=vllm.")
    _choice(errors, f"{key}.mode", r.mode, ("sync", "async"))
    agent, mt = r.agent, r.multi_turn
    if not agent.agent_loop_config_path and agent.default_agent_loop not in AGENT_LOOPS:
        errors.append(f"{key}.agent.default_agent_loop={agent.default_agent_loop!r} is not a built-in agent loop "
                      f"{list(AGENT_LOOPS)}. Fix: register it with {key}.agent.agent_loop_config_path, or pick one "
                      f"of those.")
    for k in ("agent.agent_loop_config_path", "multi_turn.tool_config_path", "multi_turn.function_tool_path"):
        path = _get(r, k)
        if path and not os.path.isfile(os.path.expanduser(path)):
            errors.append(f"{key}.{k}={path!r} is not a file. Fix: {key}.{k}=<the path of an existing file>.")
    _choice(errors, f"{key}.multi_turn.format", mt.format, TOOL_FORMATS)
    _choice(errors, f"{key}.multi_turn.tool_response_truncate_side", mt.tool_response_truncate_side, TRUNCATE_SIDES)
    _choice(errors, f"{key}.multi_turn.tokenization_sanity_check_mode", mt.tokenization_sanity_check_mode,
            SANITY_CHECK_MODES)
    _positive(errors, f"{key}.multi_turn.max_parallel_calls", mt.max_parallel_calls)
    _positive(errors, f"{key}.multi_turn.max_tool_response_length", mt.max_tool_response_length)
    if not (isinstance(mt.tool_timeout_s, (int, float)) and mt.tool_timeout_s > 0):
        errors.append(f"{key}.multi_turn.tool_timeout_s={mt.tool_timeout_s!r} must be a positive number of seconds. "
                      f"Fix: {key}.multi_turn.tool_timeout_s=30.")
    for k in ("max_assistant_turns", "max_user_turns"):
        v = getattr(mt, k)
        if v is not None and (not isinstance(v, int) or v < 1):
            errors.append(f"{key}.multi_turn.{k}={v!r} must be a positive integer or null (no limit). Fix: "
                          f"{key}.multi_turn.{k}=null.")
    tools_wanted = mt.enable or agent.default_agent_loop == "tool_agent"
    if uses_agent_loop(r) and tools_wanted and not cfg.data.return_raw_chat:
        errors.append(f"the tool_agent loop renders each row's chat itself and needs data.return_raw_chat=True "
                      f"(got False). Fix: data.return_raw_chat=True.")


def _check_reward(cfg, errors):
    rm = cfg.reward_model
    _choice(errors, "reward_model.reward_manager", rm.reward_manager, REWARD_MANAGERS)
    kwargs = rm.reward_kwargs or {}
    manager_keys = [k for k in ("overlong_buffer_cfg", "max_resp_len") if k in kwargs]
    for other in sorted(set(kwargs) - {"overlong_buffer_cfg", "max_resp_len"}):
        errors.append(f"reward_model.reward_kwargs.{other}={kwargs[other]!r}: verl passes reward_model.reward_kwargs "
                      f"only to the dapo reward manager (overlong_buffer_cfg, max_resp_len), never to the score "
                      f"function, so it would change nothing. Fix: reward_model.score_kwargs.{other}=... for the "
                      f"built-in rewards, or custom_reward_function.reward_kwargs.{other}=... for your function.")
    crf = cfg.custom_reward_function
    if crf.reward_kwargs and not crf.path:
        errors.append(f"custom_reward_function.reward_kwargs={dict(crf.reward_kwargs)!r} binds arguments of a custom "
                      f"function, and custom_reward_function.path is not set (verl ignores them then). Fix: set "
                      f"custom_reward_function.path, or use reward_model.score_kwargs for the built-in rewards.")
    if rm.score_kwargs and crf.path:
        errors.append(f"reward_model.score_kwargs={dict(rm.score_kwargs)!r} configures the built-in rewards, and "
                      f"custom_reward_function.path={crf.path!r} replaces them. Fix: move them to "
                      f"custom_reward_function.reward_kwargs.")
    if manager_keys and rm.reward_manager != "dapo":
        errors.append(f"reward_model.reward_kwargs.{manager_keys[0]} configures verl's dapo reward manager, but "
                      f"reward_model.reward_manager={rm.reward_manager!r}. Fix: reward_model.reward_manager=dapo.")
    if rm.reward_manager == "batch" and not cfg.custom_reward_function.path:
        errors.append("reward_model.reward_manager=batch calls a score function that takes lists, and the built-in "
                      "rewards take one sample. Fix: custom_reward_function.path=<file.py> defining "
                      "compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list, or "
                      "reward_model.reward_manager=naive.")
    buffer = kwargs.get("overlong_buffer_cfg")
    if rm.reward_manager != "dapo" or buffer is None:
        return
    key = "reward_model.reward_kwargs.overlong_buffer_cfg"
    if not isinstance(buffer, dict):
        errors.append(f"{key}={buffer!r} must be a dict {{enable, len, penalty_factor, log}}. Fix: set its keys, "
                      f"e.g. +{key}.enable=True +{key}.len=4096.")
        return
    unknown = sorted(set(buffer) - set(OVERLONG_BUFFER_KEYS))
    if unknown:
        errors.append(f"{key} has unknown key(s) {unknown}; verl's are {list(OVERLONG_BUFFER_KEYS)}. Fix: remove "
                      f"them.")
    if buffer.get("enable"):
        length = buffer.get("len")
        if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
            errors.append(f"{key}.len={length!r} must be a positive number of tokens with {key}.enable=True. Fix: "
                          f"{key}.len=4096 (tokens before the response limit where the penalty starts).")
        if not isinstance(buffer.get("penalty_factor"), (int, float)):
            errors.append(f"{key}.penalty_factor={buffer.get('penalty_factor')!r} must be a number with "
                          f"{key}.enable=True. Fix: {key}.penalty_factor=1.0.")


FILTER_METRICS_SEQ = ("reward", "seq_reward", "seq_final_reward")
PF_PPO_METHODS = ("pow", "max_min", "max_random")


def _check_sampling(cfg, errors):
    """DAPO's dynamic sampling (algorithm.filter_groups, data.gen_batch_size) and PF-PPO's resampling."""
    fg, data = cfg.algorithm.filter_groups, cfg.data
    gen = data.gen_batch_size
    if gen is not None and (not isinstance(gen, int) or isinstance(gen, bool) or gen <= 0):
        errors.append(f"data.gen_batch_size={gen!r} must be a positive number of prompts, or null. Fix: "
                      f"data.gen_batch_size=null.")
    elif gen is not None and gen != data.train_batch_size and not fg.enable:
        errors.append(f"data.gen_batch_size={gen} differs from data.train_batch_size={data.train_batch_size} "
                      f"without algorithm.filter_groups.enable (verl would then train each step on gen_batch_size "
                      f"prompts). Fix: data.train_batch_size={gen}, or algorithm.filter_groups.enable=True.")
    if fg.enable:
        if not isinstance(fg.metric, str) or not fg.metric:
            errors.append(f"algorithm.filter_groups.metric={fg.metric!r} must name what varies within a group: "
                          f"one of {list(FILTER_METRICS_SEQ)} or a key of the score function's dict (acc, ...). "
                          f"Fix: algorithm.filter_groups.metric=acc.")
        elif fg.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
            errors.append("algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=True: the "
                          "KL penalty is computed after the groups are chosen. Fix: metric=seq_reward (the score "
                          "before the penalty), or algorithm.use_kl_in_reward=False.")
        if not isinstance(fg.max_num_gen_batches, int) or isinstance(fg.max_num_gen_batches, bool):
            errors.append(f"algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches!r} must be an "
                          f"integer (0 or less: no limit). Fix: algorithm.filter_groups.max_num_gen_batches=10.")
    if not isinstance(fg.max_inflight_gen_batches, int) or fg.max_inflight_gen_batches <= 0:
        errors.append(f"algorithm.filter_groups.max_inflight_gen_batches={fg.max_inflight_gen_batches!r} must be a "
                      f"positive integer. Fix: algorithm.filter_groups.max_inflight_gen_batches=1.")
    _check_rollout_correction(cfg, errors)
    pf = cfg.algorithm.pf_ppo
    _choice(errors, "algorithm.pf_ppo.reweight_method", pf.reweight_method, PF_PPO_METHODS)
    if not isinstance(pf.weight_pow, (int, float)) or isinstance(pf.weight_pow, bool):
        errors.append(f"algorithm.pf_ppo.weight_pow={pf.weight_pow!r} must be a number. Fix: "
                      f"algorithm.pf_ppo.weight_pow=2.0.")


def _check_rollout_correction(cfg, errors):
    from rlx.algos.rollout_correction import IS_LEVELS, parse_is_threshold, parse_rs

    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    if rc.rollout_is is not None:
        if rc.rollout_is not in IS_LEVELS:
            errors.append(f"{key}.rollout_is={rc.rollout_is!r} is not valid; choose one of {list(IS_LEVELS)} or null. "
                          f"Fix: {key}.rollout_is=token, or null.")
        if rc.rollout_is_threshold is None:
            errors.append(f"{key}.rollout_is_threshold=null with {key}.rollout_is={rc.rollout_is!r}: no weights would "
                          f"be computed (verl skips them). Fix: a number (TIS) or 'lower_upper' (IcePop).")
        else:
            try:
                parse_is_threshold(rc.rollout_is_threshold)
            except ValueError as e:
                errors.append(f"{e}. Fix: {key}.rollout_is_threshold=2.0 (TIS), or a 'lower_upper' pair such as "
                              f"'0.5_2.0' (IcePop).")
    if rc.rollout_rs is not None:
        try:
            parse_rs(rc.rollout_rs, rc.rollout_rs_threshold)
        except ValueError as e:
            errors.append(f"{e}. Fix: see docs/algorithms.md (rollout correction) for each option's threshold.")
    if rc.bypass_mode:
        from rlx.algos.rollout_correction import BYPASS_LOSS_TYPES

        _choice(errors, f"{key}.loss_type", rc.loss_type, BYPASS_LOSS_TYPES)
        if not cfg.actor_rollout_ref.rollout.calculate_log_probs:
            errors.append(f"{key}.bypass_mode=True uses the rollout engine's log-probs as the old ones, and "
                          f"actor_rollout_ref.rollout.calculate_log_probs=False. Fix: "
                          f"actor_rollout_ref.rollout.calculate_log_probs=True.")
        mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
        if mode != "vanilla":
            errors.append(f"{key}.bypass_mode=True computes its own loss ({key}.loss_type={rc.loss_type}), and "
                          f"actor_rollout_ref.actor.policy_loss.loss_mode={mode} would not be used (verl replaces it "
                          f"silently). Fix: loss_mode=vanilla, or {key}.bypass_mode=False.")
    elif (rc.rollout_is is not None or rc.rollout_rs is not None) and \
            not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        errors.append(f"{key}.rollout_is={rc.rollout_is!r} / rollout_rs={rc.rollout_rs!r} compare the trainer's "
                      f"log-probs with the rollout engine's, and actor_rollout_ref.rollout.calculate_log_probs=False "
                      f"(verl then silently corrects nothing). Fix: actor_rollout_ref.rollout.calculate_log_probs=True.")


def _check_data_trainer(cfg, errors):
    _choice(errors, "data.truncation", cfg.data.truncation, TRUNCATIONS)
    for key in ("data.max_prompt_length", "data.max_response_length", "data.train_batch_size"):
        if _get(cfg, key) <= 0:
            errors.append(f"{key} must be positive, got {_get(cfg, key)}. Fix: {key}=<a positive integer>.")
    t = cfg.trainer
    _choice(errors, "trainer.device", t.device, ("cpu", "cuda"))  # `auto` is resolved at load (rlx.config.device)
    _choice(errors, "trainer.resume_mode", t.resume_mode, ("auto", "disable", "resume_path"))
    _choice(errors, "trainer.use_legacy_worker_impl", t.use_legacy_worker_impl, LEGACY_WORKER_IMPL)
    _choice(errors, "trainer.on_damaged_checkpoint", t.on_damaged_checkpoint, ("previous", "error"))
    if t.log_val_generations < 0:
        errors.append(f"trainer.log_val_generations={t.log_val_generations} must be >= 0 (0: none). Fix: "
                      f"trainer.log_val_generations=0.")
    if t.max_consecutive_skipped_steps < 0:
        errors.append(f"trainer.max_consecutive_skipped_steps={t.max_consecutive_skipped_steps} must be >= 0 "
                      f"(0: never stop on skipped steps). Fix: trainer.max_consecutive_skipped_steps=3.")
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        errors.append("trainer.resume_mode=resume_path needs the checkpoint to resume from. Fix: "
                      "trainer.resume_from_path=<a global_step_N dir>, or trainer.resume_mode=auto.")
    loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    for name in loggers:
        _choice(errors, "trainer.logger", name, LOGGERS)
    if "wandb" in loggers and importlib.util.find_spec("wandb") is None:  # a dependency: a broken install only
        errors.append("trainer.logger includes wandb but wandb is not installed (a dependency of rlx). Fix: "
                      "pip install wandb, or drop it from trainer.logger.")
    if "swanlab" in loggers and importlib.util.find_spec("swanlab") is None:  # an optional extra
        errors.append("trainer.logger=swanlab needs the swanlab package, an optional extra of rlx that is not "
                      "installed. Fix: pip install swanlab (or pip install 'rlx[swanlab]'), or drop swanlab from "
                      "trainer.logger.")
    if t.total_training_steps is not None and t.total_training_steps <= 0:
        errors.append(f"trainer.total_training_steps={t.total_training_steps} must be positive or null. Fix: "
                      f"trainer.total_training_steps=null (trainer.total_epochs decides).")


# apply_chat_template arguments that rlx's dataset sets itself
CHAT_TEMPLATE_OWN_KWARGS = ("conversation", "tokenize", "add_generation_prompt", "return_dict", "return_tensors")


def _check_data_keys(cfg, errors):
    """data.apply_chat_template_kwargs and data.custom_cls have the right shape (the class itself is loaded and
    checked by the preflight)."""
    kwargs = cfg.data.apply_chat_template_kwargs
    if not isinstance(kwargs, dict):
        errors.append(f"data.apply_chat_template_kwargs={kwargs!r} must be a mapping of keyword arguments. Fix: "
                      f"set its keys one by one, e.g. data.apply_chat_template_kwargs.enable_thinking=false.")
    else:
        own = [k for k in kwargs if k in CHAT_TEMPLATE_OWN_KWARGS]
        if own:
            errors.append(f"data.apply_chat_template_kwargs sets {own}, which rlx's dataset sets itself (prompts are "
                          f"rendered as text with add_generation_prompt=True, then tokenized). Fix: remove them.")
    custom = cfg.data.custom_cls
    if not isinstance(custom, dict) or set(custom) - {"path", "name"}:
        errors.append(f"data.custom_cls={custom!r} must be {{path: <file.py>, name: <class name>}} (or both null). "
                      f"Fix: data.custom_cls.path=<file.py> data.custom_cls.name=<class name>.")
    elif custom.get("path") and not custom.get("name"):
        errors.append(f"data.custom_cls.path={custom['path']!r} needs data.custom_cls.name. Fix: "
                      f"data.custom_cls.name=<the dataset class in that file>.")
    elif custom.get("name") and not custom.get("path"):
        errors.append(f"data.custom_cls.name={custom['name']!r} without data.custom_cls.path. Fix: "
                      f"data.custom_cls.path=<the Python file that defines it>, or data.custom_cls.name=null.")
def profiler_roles(cfg) -> dict:
    """{key of a role's profiler: its config} of the roles this job builds; the actor worker's ones first."""
    arr = cfg.actor_rollout_ref
    roles = {"actor_rollout_ref.actor.profiler": arr.actor.profiler,
             "actor_rollout_ref.rollout.profiler": arr.rollout.profiler}
    built = plan_roles(cfg)
    if built.ref:
        roles["actor_rollout_ref.ref.profiler"] = arr.ref.profiler
    if built.critic:
        roles["critic.profiler"] = cfg.critic.profiler
    return roles


def _check_profiler(cfg, errors):
    """global_profiler.* and the roles' profiler keys (rlx.workers.profiling)."""
    g = cfg.global_profiler
    tools = {"global_profiler.tool": g.tool,  # a role's own tool is named where it is not the global one it follows
             **{f"{k}.tool": c.tool for k, c in profiler_roles(cfg).items() if c.tool != g.tool}}
    for key, tool in tools.items():
        if tool in REFUSED_PROFILER_TOOLS:
            errors.append(f"{key}={tool} is not supported by rlx: {REFUSED_PROFILER_TOOLS[tool]}. Fix: "
                          f"global_profiler.tool=torch (chrome traces) or torch_memory (CUDA memory snapshots).")
        elif tool not in PROFILER_TOOLS:
            errors.append(f"{key}={tool!r} is not valid; choose one of {list(PROFILER_TOOLS)}. Fix: {key}=torch, "
                          f"or null.")
        elif tool == "torch_memory" and cfg.trainer.device != "cuda":
            errors.append(f"{key}=torch_memory records CUDA's allocator and needs trainer.device=cuda (this run: "
                          f"{cfg.trainer.device}). Fix: global_profiler.tool=torch (its contents=[memory] records "
                          f"CPU allocations too), or run on GPUs.")
    steps = g.steps or []
    if not isinstance(steps, list) or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in steps):
        errors.append(f"global_profiler.steps={g.steps!r} must be a list of training steps (1, 2, ...) or null. "
                      f"Fix: global_profiler.steps=[1,2], or null.")
    traced = {}
    for key, c in profiler_roles(cfg).items():
        contents = c.tool_config.torch.contents
        bad = [x for x in contents if x not in TORCH_CONTENTS]
        if bad:
            errors.append(f"{key}.tool_config.torch.contents has {bad}; choose among {list(TORCH_CONTENTS)}. Fix: "
                          f"remove {bad}.")
        if "cuda" in contents and cfg.trainer.device != "cuda":
            errors.append(f"{key}.tool_config.torch.contents has cuda (GPU kernels) but trainer.device="
                          f"{cfg.trainer.device}. Fix: leave cuda out (CPU operators are always recorded).")
        if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in c.ranks):
            errors.append(f"{key}.ranks={c.ranks!r} must list ranks (0, 1, ...). Fix: {key}.ranks=[0].")
        if c.tool == "torch" and c.enable and not key.startswith("critic."):
            traced[key] = c.tool_config.torch.discrete
    if len(set(traced.values())) > 1:  # one process, one torch profiler at a time
        shown = ", ".join(f"{k}.tool_config.torch.discrete={v}" for k, v in traced.items())
        errors.append(f"the actor, rollout and ref phases run in one process, whose profiler is either one trace "
                      f"per step or one per phase: {shown} differ. Fix: give them the same value.")


def _check_device(cfg, errors):
    from rlx.config.device import fsdp_configs, joins_cluster, visible_gpu_count

    t = cfg.trainer
    for prefix, fsdp_cfg in fsdp_configs(cfg).items():
        for k, v in (fsdp_cfg.mixed_precision or {}).items():
            if k not in MIXED_PRECISION_KEYS:
                errors.append(f"{prefix}.mixed_precision.{k} is not a mixed-precision key; choose one of "
                              f"{list(MIXED_PRECISION_KEYS)}. Fix: remove it.")
            elif v not in DTYPE_NAMES:
                errors.append(f"{prefix}.mixed_precision.{k}={v!r} is not valid; choose one of {list(DTYPE_NAMES)}. "
                              f"Fix: {prefix}.mixed_precision.{k}=bf16 (or fp32).")
    if t.device != "cuda" or joins_cluster(cfg):  # a cluster's GPUs are checked when the workers are placed
        return
    gpus = visible_gpu_count()
    if gpus == 0:
        errors.append("trainer.device=cuda but this machine has no GPU (torch.cuda.is_available() is False and "
                      "nvidia-smi lists none). Fix: trainer.device=cpu (or auto), or join a GPU cluster with "
                      "ray_init.address=<head-ip>:6379.")
    elif t.nnodes > 1:
        errors.append(f"trainer.nnodes={t.nnodes} needs a Ray cluster of that many nodes; this run starts a local "
                      f"Ray. Fix: ray_init.address=<head-ip>:6379 (or submit it with `ray job submit`), or "
                      f"trainer.nnodes=1.")
    elif not cfg.actor_rollout_ref.hybrid_engine and t.n_gpus_per_node + cfg.rollout.n_gpus_per_node > gpus:
        errors.append(f"trainer.n_gpus_per_node={t.n_gpus_per_node} + rollout.n_gpus_per_node="
                      f"{cfg.rollout.n_gpus_per_node} (actor_rollout_ref.hybrid_engine=False: the rollout's own GPUs) "
                      f"but this machine has {gpus} GPU(s). Fix: fewer GPUs for either.")
    elif t.n_gpus_per_node > gpus:
        errors.append(f"trainer.n_gpus_per_node={t.n_gpus_per_node} but this machine has {gpus} GPU(s). Fix: "
                      f"trainer.n_gpus_per_node={gpus}.")
    elif _valid_pool(cfg) and reward_model_pool(cfg) is not None:
        rm = cfg.reward_model
        if rm.nnodes > 1:
            errors.append(f"reward_model.nnodes={rm.nnodes} needs a Ray cluster of that many nodes; this run starts a "
                          f"local Ray. Fix: ray_init.address=<head-ip>:6379, or reward_model.nnodes=1.")
        elif t.n_gpus_per_node + rm.n_gpus_per_node > gpus:
            errors.append(f"trainer.n_gpus_per_node={t.n_gpus_per_node} + reward_model.n_gpus_per_node="
                          f"{rm.n_gpus_per_node} (the reward model's own pool, reward_model.enable_resource_pool=True)"
                          f" but this machine has {gpus} GPU(s). Fix: fewer GPUs for either, or "
                          f"reward_model.enable_resource_pool=False (colocated).")


def _valid_pool(cfg) -> bool:
    rm = cfg.reward_model
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (rm.nnodes, rm.n_gpus_per_node))


def in_ray_job() -> bool:
    """True in the driver of a `ray job submit` job (the job supervisor sets this variable)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def local_dir_writers(cfg) -> list[str]:
    """What the job will write under `trainer.default_local_dir` (empty: nothing, so its path does not matter):
    checkpoints, the file logger, tensorboard's event files (unless TENSORBOARD_DIR names their place), wandb's
    local files (unless WANDB_DIR does), swanlab's (unless SWANLAB_LOG_DIR does)."""
    t = cfg.trainer
    loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    writers = []
    if t.save_freq > 0:
        writers.append(f"checkpoints (trainer.save_freq={t.save_freq})")
    if "file" in loggers:
        writers.append("the file logger's metrics.jsonl (trainer.logger has file)")
    if "tensorboard" in loggers and not os.environ.get("TENSORBOARD_DIR"):
        writers.append("tensorboard event files (trainer.logger has tensorboard, TENSORBOARD_DIR is unset)")
    if "wandb" in loggers and not os.environ.get("WANDB_DIR"):
        writers.append("wandb's local files (trainer.logger has wandb, WANDB_DIR is unset)")
    if "swanlab" in loggers and not os.environ.get("SWANLAB_LOG_DIR"):
        writers.append("swanlab's local files (trainer.logger has swanlab, SWANLAB_LOG_DIR is unset)")
    return writers


def _check_output_paths(cfg, errors):
    """Under `ray job submit` the driver's working directory is Ray's temporary copy of --working-dir, deleted when
    the job ends: whatever the job writes must go to an absolute path. A relative path the job never writes to
    (`trainer.default_local_dir` of a job without checkpoints or file logs) is fine."""
    if not in_ray_job():
        return
    t = cfg.trainer
    paths = {}
    writers = local_dir_writers(cfg)
    if writers:
        paths["trainer.default_local_dir"] = (t.default_local_dir, ", ".join(writers) + " go there")
    if t.resume_mode == "resume_path":
        paths["trainer.resume_from_path"] = (t.resume_from_path, "the checkpoint to resume from is read there")
    for key, c in profiler_roles(cfg).items():  # traces and memory snapshots
        if c.tool == "torch_memory" or (c.tool == "torch" and c.enable and cfg.global_profiler.steps):
            paths[f"{key}.save_path"] = (c.save_path, "profiler output goes there")
    if cfg.ray_init.timeline_json_file:
        paths["ray_init.timeline_json_file"] = (cfg.ray_init.timeline_json_file, "Ray's timeline is written there")
    loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    env_keys = [k for name, k in (("tensorboard", "TENSORBOARD_DIR"), ("wandb", "WANDB_DIR"),
                                  ("swanlab", "SWANLAB_LOG_DIR")) if name in loggers]
    paths.update({f"the environment variable {k}": (os.environ.get(k), "logs go there") for k in env_keys})
    for key, (path, why) in paths.items():
        if path and not os.path.isabs(os.path.expanduser(path)):
            errors.append(f"{key}={path!r} is a relative path ({why}), and this driver runs as a Ray job in Ray's "
                          f"temporary copy of the working dir ({os.getcwd()}), deleted when the job ends. Fix: give "
                          f"an absolute path on the head node (or shared storage), e.g. {key.split()[-1]}="
                          f"/abs/path/{path.lstrip('./')}.")


def validate_config(cfg: RLXConfig) -> None:
    """Raise one ValueError listing every problem of `config_errors`."""
    errors = config_errors(cfg)
    if errors:
        raise ValueError("Invalid rlx config:\n  - " + "\n  - ".join(errors))


def config_errors(cfg: RLXConfig) -> list[str]:
    """Every cross-key problem of `cfg`, one message each (key, value, fix), in rule order, without repeats."""
    errors: list[str] = []
    _check_not_supported(cfg, errors)
    _check_offload(cfg, errors)
    _check_strategies(cfg, errors)
    _check_batch_sizes(cfg, errors)
    _check_long_sequences(cfg, errors)
    _check_sequence_parallel(cfg, errors)
    _check_fsdp_size(cfg, errors)
    _check_timeout(cfg, errors)
    _check_kernels(cfg, errors)
    _check_lora(cfg, errors)
    _check_algorithm(cfg, errors)
    _check_rollout(cfg, errors)
    _check_agent(cfg, errors)
    _check_reward(cfg, errors)
    _check_reward_model(cfg, errors)
    _check_judge(cfg, errors)
    _check_sampling(cfg, errors)
    _check_data_trainer(cfg, errors)
    _check_data_keys(cfg, errors)
    _check_profiler(cfg, errors)
    _check_device(cfg, errors)
    _check_output_paths(cfg, errors)
    errors += check_async_training(cfg)
    return list(dict.fromkeys(errors))  # de-duplicated, in order
