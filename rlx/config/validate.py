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
from rlx.config.schema import DEPRECATED, FOLLOWS, NOT_SUPPORTED, RLXConfig

STRATEGIES = ("fsdp", "fsdp2")
ROLLOUT_NAMES = ("auto", "vllm", "hf")
TRUNCATIONS = ("error", "left", "right", "middle")
LOGGERS = ("console", "file", "tensorboard", "wandb")
MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")
DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
ROLLOUT_DTYPES = ("bfloat16", "float16", "float32")
LOAD_FORMATS = ("dummy_dtensor", "dummy", "auto", "safetensors", "pt")
REWARD_MANAGERS = ("naive", "dapo", "batch")
OVERLONG_BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _choice(errors, key, value, choices):
    if value not in choices:
        errors.append(f"{key}={value!r} is not valid; choose one of {list(choices)}.")


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


def _sp_roles(cfg):
    """(sp key, sp, model key prefix, model config) of each role that is built with sp > 1."""
    ref_built = cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    for role, model_prefix in SP_ROLES:
        if role == "actor_rollout_ref.ref" and not ref_built:
            continue
        if role == "critic" and cfg.algorithm.adv_estimator != "gae":
            continue
        yield f"{role}.ulysses_sequence_parallel_size", _get(cfg, f"{role}.ulysses_sequence_parallel_size"), \
            model_prefix, _get(cfg, model_prefix)


def _check_sequence_parallel(cfg, errors):
    """Ulysses: sp splits the world into groups, the attention heads among a group's ranks; needs packed rows."""
    ws = world_size(cfg)
    for key, sp, prefix, model in _sp_roles(cfg):
        if not isinstance(sp, int) or isinstance(sp, bool) or sp < 1:
            errors.append(f"{key}={sp!r} must be a positive integer (1 turns sequence parallelism off).")
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
            errors.append(f"{key}={value!r} is not supported yet by rlx; remove it (or set {key}={default}).")
    for key, replacement in DEPRECATED.items():
        if _get(cfg, key) is not None:
            errors.append(f"{key} is deprecated in verl and not supported by rlx; set {replacement} instead.")
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
        if role == "critic" and cfg.algorithm.adv_estimator != "gae":
            continue  # no critic is built
        layers = model.override_config.get("num_hidden_layers") or num_hidden_layers(model.path)
        if layers is not None and layers < 3:
            errors.append(f"{prefix}.enable_activation_offload=True needs a model with at least 3 decoder layers "
                          f"({prefix}.path={model.path!r} has {layers}); set "
                          f"{prefix}.enable_activation_offload=False.")


def _check_strategies(cfg, errors):
    for key in ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy"):
        value = _get(cfg, key)
        if value not in STRATEGIES:
            errors.append(f"{key}={value!r} is not supported; rlx trains with fsdp or fsdp2. Fix: {key}=fsdp2.")
    for strategy_key, prefix in (("actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.fsdp_config"),
                                 ("actor_rollout_ref.ref.strategy", "actor_rollout_ref.ref.fsdp_config"),
                                 ("critic.strategy", "critic.model.fsdp_config")):
        if _get(cfg, strategy_key) == "fsdp" and _get(cfg, f"{prefix}.offload_policy"):
            errors.append(f"{prefix}.offload_policy=True is FSDP2's CPUOffloadPolicy, but {strategy_key}=fsdp. Fix: "
                          f"{strategy_key}=fsdp2, or {prefix}.param_offload=True (both strategies) instead.")


def _check_batch_sizes(cfg, errors):
    ws = world_size(cfg)
    n = cfg.actor_rollout_ref.rollout.n
    tbs = cfg.data.train_batch_size
    if ws < 1:
        errors.append(f"trainer.nnodes * trainer.n_gpus_per_node must be >= 1, got {ws}.")
        return
    if (tbs * n) % ws:
        errors.append(f"data.train_batch_size * actor_rollout_ref.rollout.n = {tbs}*{n} = {tbs * n} sequences do not "
                      f"divide across world size {ws} (trainer.nnodes * trainer.n_gpus_per_node); choose sizes so "
                      f"that it divides.")
    roles = [("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor)]
    if cfg.algorithm.adv_estimator == "gae":
        roles.append(("critic", cfg.critic))
    for prefix, role in roles:
        mini, micro = role.ppo_mini_batch_size, role.ppo_micro_batch_size_per_gpu
        if mini <= 0 or tbs % mini:
            errors.append(f"{prefix}.ppo_mini_batch_size={mini} must be positive and divide data.train_batch_size="
                          f"{tbs}.")
            continue
        sp = role.ulysses_sequence_parallel_size
        # the ranks of a sequence-parallel group share rows: a mini-batch splits over world / sp groups
        dp = ws // sp if isinstance(sp, int) and sp >= 1 and ws % sp == 0 else ws
        if (mini * n) % dp:
            where = f"world size {ws}" if dp == ws else f"{dp} data-parallel groups (world size {ws} / {sp})"
            errors.append(f"{prefix}.ppo_mini_batch_size * rollout.n = {mini}*{n} = {mini * n} sequences must divide "
                          f"across {where}; change {prefix}.ppo_mini_batch_size or trainer.n_gpus_per_node.")
            continue
        # micro-batches need not divide the mini-batch (the last one may be smaller; gradients stay exact)
        if role.use_dynamic_bsz:
            _positive(errors, f"{prefix}.ppo_max_token_len_per_gpu", role.ppo_max_token_len_per_gpu,
                      f"(the token budget of {prefix}.use_dynamic_bsz=True)")
        elif micro is None or micro <= 0:
            errors.append(f"{prefix}.ppo_micro_batch_size_per_gpu={micro!r} must be a positive integer (or set "
                          f"{prefix}.use_dynamic_bsz=True with {prefix}.ppo_max_token_len_per_gpu).")
    for prefix, dyn in (("actor_rollout_ref.rollout", "log_prob_use_dynamic_bsz"),
                        ("actor_rollout_ref.ref", "log_prob_use_dynamic_bsz")):
        if _get(cfg, f"{prefix}.{dyn}"):
            _positive(errors, f"{prefix}.log_prob_max_token_len_per_gpu",
                      _get(cfg, f"{prefix}.log_prob_max_token_len_per_gpu"), f"(the token budget of {prefix}.{dyn})")
            continue
        key = f"{prefix}.log_prob_micro_batch_size_per_gpu"
        value = _get(cfg, key)
        if value is None or value <= 0:
            errors.append(f"{key}={value!r} must be a positive integer (or set {prefix}.{dyn}=True).")
    if cfg.algorithm.adv_estimator == "gae":
        c = cfg.critic
        if c.use_dynamic_bsz:
            _positive(errors, "critic.forward_max_token_len_per_gpu", c.forward_max_token_len_per_gpu,
                      "(the token budget of critic.use_dynamic_bsz=True)")
        elif c.forward_micro_batch_size_per_gpu is None or c.forward_micro_batch_size_per_gpu <= 0:
            errors.append(f"critic.forward_micro_batch_size_per_gpu={c.forward_micro_batch_size_per_gpu!r} must be a "
                          f"positive integer.")


def _positive(errors, key, value, what=""):
    if value is None or value <= 0:
        errors.append(f"{key}={value!r} must be a positive integer {what}.".replace(" .", "."))


def _check_long_sequences(cfg, errors):
    """The fused head's chunk and the MLP tile sizes."""
    model = cfg.actor_rollout_ref.model
    if model.use_fused_kernels:
        _positive(errors, "actor_rollout_ref.model.fused_kernel_options.chunk_size",
                  model.fused_kernel_options.chunk_size, "(tokens per chunk of the fused head)")
    for prefix in ("actor_rollout_ref.model", "critic.model"):
        tile = _get(cfg, f"{prefix}.tile_mlp_tokens")
        if tile < 0:
            errors.append(f"{prefix}.tile_mlp_tokens={tile} must be >= 0 (0 turns MLP tiling off).")
        elif tile and _get(cfg, f"{prefix}.activation_offload.recompute_mlp"):
            errors.append(f"{prefix}.tile_mlp_tokens={tile} and {prefix}.activation_offload.recompute_mlp=True both "
                          f"replace the MLP's forward; choose one (tiling also recomputes the MLP in backward).")
        layer = _get(cfg, f"{prefix}.tile_layer_tokens")
        if layer < 0:
            errors.append(f"{prefix}.tile_layer_tokens={layer} must be >= 0 (0 turns layer tiling off).")
        elif layer and not _get(cfg, f"{prefix}.enable_gradient_checkpointing"):
            errors.append(f"{prefix}.tile_layer_tokens={layer} recomputes each decoder layer in backward (a tiled "
                          f"form of checkpointing); set {prefix}.enable_gradient_checkpointing=True, or "
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
        errors.append(f"{key}.lora_rank={rank!r} must be an integer >= 0 (0 turns LoRA off).")
        return
    if rank == 0:
        return
    if not isinstance(model.lora_alpha, (int, float)) or isinstance(model.lora_alpha, bool) or model.lora_alpha <= 0:
        errors.append(f"{key}.lora_alpha={model.lora_alpha!r} must be a positive number (the adapters are scaled "
                      f"by lora_alpha / lora_rank).")
    lists = {}
    for k in ("target_modules", "exclude_modules"):
        v = _get(model, k)
        if v is None and k == "exclude_modules":
            continue
        if isinstance(v, str):
            if not v:
                errors.append(f"{key}.{k}='' names no module; give all-linear or a list such as [q_proj,v_proj].")
            continue
        if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, str) and x for x in v):
            errors.append(f"{key}.{k}={v!r} must be all-linear, a module name / regex, or a non-empty list of module "
                          f"names such as [q_proj,k_proj,v_proj,o_proj].")
            continue
        lists[k] = list(v)
    for k in ("lm_head", "embed_tokens"):
        if k in lists.get("target_modules", []):
            errors.append(f"{key}.target_modules contains {k}: rlx puts LoRA on the decoder layers' linear projections "
                          f"only (the fused head reads the output projection's weight, tied to the embedding). "
                          f"Remove {k}.")
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
                                  f"are {linear} (or use target_modules=all-linear).")
    strategy = cfg.actor_rollout_ref.actor.strategy
    if strategy == "fsdp" and cfg.actor_rollout_ref.actor.fsdp_config.model_dtype not in ("fp32", "float32"):
        errors.append(f"{key}.lora_rank={rank} with actor.strategy=fsdp and actor.fsdp_config.model_dtype="
                      f"{cfg.actor_rollout_ref.actor.fsdp_config.model_dtype}: FSDP1 flattens a layer's frozen base "
                      f"and its fp32 adapters into one buffer of one dtype. Fix: actor.strategy=fsdp2 (a bf16 base "
                      f"with fp32 adapters), or actor.fsdp_config.model_dtype=fp32.")


def _check_algorithm(cfg, errors):
    alg, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    _choice(errors, "algorithm.adv_estimator", alg.adv_estimator, ADV_ESTIMATORS)
    if alg.adv_estimator in ("grpo", "rloo", "grpo_vectorized", "rloo_vectorized", "grpo_passk") and rollout.n < 2:
        errors.append(f"algorithm.adv_estimator={alg.adv_estimator} compares responses within a group and needs "
                      f"actor_rollout_ref.rollout.n >= 2, got {rollout.n}. Fix: actor_rollout_ref.rollout.n=4 "
                      f"(or algorithm.adv_estimator=gae).")
    _choice(errors, "actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
    _choice(errors, "actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, KL_TYPES)
    _choice(errors, "algorithm.kl_penalty", alg.kl_penalty, KL_TYPES)
    _choice(errors, "algorithm.kl_ctrl.type", alg.kl_ctrl.type, KL_CTRL_TYPES)
    if alg.adv_estimator == "gae":
        _choice(errors, "critic.loss_agg_mode", cfg.critic.loss_agg_mode, LOSS_AGG_MODES)
    if actor.clip_ratio_c <= 1.0:
        errors.append(f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1 (dual clip).")
    _check_policy_loss(cfg, errors)
    _check_estimator_inputs(cfg, errors)


def _check_policy_loss(cfg, errors):
    actor = cfg.actor_rollout_ref.actor
    pl, key = actor.policy_loss, "actor_rollout_ref.actor.policy_loss"
    _choice(errors, f"{key}.loss_mode", pl.loss_mode, LOSS_MODES)
    if pl.loss_mode == "dro" and (pl.dro_beta is None or not pl.dro_beta > 0):
        errors.append(f"{key}.loss_mode=dro needs {key}.dro_beta > 0, got {pl.dro_beta}. Fix: {key}.dro_beta=0.1.")
    if pl.loss_mode == "clip_cov" and not pl.clip_cov_ratio > 0:
        errors.append(f"{key}.clip_cov_ratio={pl.clip_cov_ratio} must be > 0 with loss_mode=clip_cov.")
    if pl.loss_mode == "kl_cov" and not pl.kl_cov_ratio > 0:
        errors.append(f"{key}.kl_cov_ratio={pl.kl_cov_ratio} must be > 0 with loss_mode=kl_cov.")
    if actor.loss_scale_factor is not None and not actor.loss_scale_factor > 0:
        errors.append(f"actor_rollout_ref.actor.loss_scale_factor={actor.loss_scale_factor} must be > 0 (or null: "
                      f"the response length).")


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
                      f"algorithm.gdpo_reward_keys entry ({list(alg.gdpo_reward_keys or [])}).")
    for key in ("actor_rollout_ref.actor.optim.warmup_style", "critic.optim.warmup_style"):
        _choice(errors, key, _get(cfg, key), ("constant", "cosine"))


def _check_rollout(cfg, errors):
    r = cfg.actor_rollout_ref.rollout
    _choice(errors, "actor_rollout_ref.rollout.name", r.name, ROLLOUT_NAMES)
    if r.name == "vllm" and importlib.util.find_spec("vllm") is None:
        from rlx.config.device import VLLM_INSTALL_HINT
        errors.append(f"actor_rollout_ref.rollout.name=vllm but vLLM is not installed. {VLLM_INSTALL_HINT} "
                      f"Or use actor_rollout_ref.rollout.name=hf.")
    greedy = (not r.do_sample) or r.temperature == 0
    if r.n > 1 and greedy:
        errors.append(f"actor_rollout_ref.rollout.n={r.n} with greedy sampling (do_sample={r.do_sample}, "
                      f"temperature={r.temperature}) gives n identical responses; set "
                      f"actor_rollout_ref.rollout.do_sample=True and temperature > 0, or n=1.")
    ws = world_size(cfg)
    tp = r.tensor_model_parallel_size
    if tp < 1 or ws % tp:
        errors.append(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the world size {ws} "
                      f"(trainer.nnodes * trainer.n_gpus_per_node).")
    if tp > 1 and cfg.trainer.device == "cpu":
        errors.append(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} needs GPUs (trainer.device=cuda). "
                      f"Fix: actor_rollout_ref.rollout.tensor_model_parallel_size=1.")
    engine_kwargs = r.engine_kwargs or {}
    if "vllm" in engine_kwargs:  # verl's layout {vllm: {...}, sglang: {...}}: rlx's engine is vLLM
        for other, value in engine_kwargs.items():
            if other != "vllm" and (not isinstance(value, dict) or any(v is not None for v in value.values())):
                errors.append(f"actor_rollout_ref.rollout.engine_kwargs.{other}={value!r} configures another engine; "
                              f"rlx's rollout engine is vLLM. Fix: remove it, or move its keys under "
                              f"actor_rollout_ref.rollout.engine_kwargs.vllm.")
    _choice(errors, "actor_rollout_ref.rollout.dtype", r.dtype, ROLLOUT_DTYPES)
    _choice(errors, "actor_rollout_ref.rollout.load_format", r.load_format, LOAD_FORMATS)
    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    if r.max_model_len is not None and r.max_model_len < need:
        errors.append(f"actor_rollout_ref.rollout.max_model_len={r.max_model_len} is smaller than data.max_prompt_length"
                      f" + data.max_response_length = {need}; raise max_model_len or shorten the lengths.")


def _check_reward(cfg, errors):
    rm = cfg.reward_model
    _choice(errors, "reward_model.reward_manager", rm.reward_manager, REWARD_MANAGERS)
    kwargs = rm.reward_kwargs or {}
    manager_keys = [k for k in ("overlong_buffer_cfg", "max_resp_len") if k in kwargs]
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
        errors.append(f"{key}={buffer!r} must be a dict {{enable, len, penalty_factor, log}}.")
        return
    unknown = sorted(set(buffer) - set(OVERLONG_BUFFER_KEYS))
    if unknown:
        errors.append(f"{key} has unknown key(s) {unknown}; verl's are {list(OVERLONG_BUFFER_KEYS)}.")
    if buffer.get("enable"):
        length = buffer.get("len")
        if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
            errors.append(f"{key}.len={length!r} must be a positive number of tokens with {key}.enable=True.")
        if not isinstance(buffer.get("penalty_factor"), (int, float)):
            errors.append(f"{key}.penalty_factor={buffer.get('penalty_factor')!r} must be a number with "
                          f"{key}.enable=True.")


def _check_data_trainer(cfg, errors):
    _choice(errors, "data.truncation", cfg.data.truncation, TRUNCATIONS)
    for key in ("data.max_prompt_length", "data.max_response_length", "data.train_batch_size"):
        if _get(cfg, key) <= 0:
            errors.append(f"{key} must be positive, got {_get(cfg, key)}.")
    t = cfg.trainer
    _choice(errors, "trainer.device", t.device, ("cpu", "cuda"))  # `auto` is resolved at load (rlx.config.device)
    _choice(errors, "trainer.resume_mode", t.resume_mode, ("auto", "disable", "resume_path"))
    _choice(errors, "trainer.on_damaged_checkpoint", t.on_damaged_checkpoint, ("previous", "error"))
    if t.log_val_generations < 0:
        errors.append(f"trainer.log_val_generations={t.log_val_generations} must be >= 0 (0: none).")
    if t.max_consecutive_skipped_steps < 0:
        errors.append(f"trainer.max_consecutive_skipped_steps={t.max_consecutive_skipped_steps} must be >= 0 "
                      f"(0: never stop on skipped steps).")
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint dir>.")
    loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    for name in loggers:
        _choice(errors, "trainer.logger", name, LOGGERS)
    if "wandb" in loggers and importlib.util.find_spec("wandb") is None:
        errors.append("trainer.logger includes wandb but wandb is not installed: pip install wandb "
                      "(or drop it from trainer.logger).")
    if t.total_training_steps is not None and t.total_training_steps <= 0:
        errors.append(f"trainer.total_training_steps={t.total_training_steps} must be positive or null.")


def _check_device(cfg, errors):
    from rlx.config.device import fsdp_configs, joins_cluster, visible_gpu_count

    t = cfg.trainer
    for prefix, fsdp_cfg in fsdp_configs(cfg).items():
        for k, v in (fsdp_cfg.mixed_precision or {}).items():
            if k not in MIXED_PRECISION_KEYS:
                errors.append(f"{prefix}.mixed_precision.{k} is not a mixed-precision key; choose one of "
                              f"{list(MIXED_PRECISION_KEYS)}.")
            elif v not in DTYPE_NAMES:
                errors.append(f"{prefix}.mixed_precision.{k}={v!r} is not valid; choose one of {list(DTYPE_NAMES)}.")
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
    elif t.n_gpus_per_node > gpus:
        errors.append(f"trainer.n_gpus_per_node={t.n_gpus_per_node} but this machine has {gpus} GPU(s). Fix: "
                      f"trainer.n_gpus_per_node={gpus}.")


def in_ray_job() -> bool:
    """True in the driver of a `ray job submit` job (the job supervisor sets this variable)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def local_dir_writers(cfg) -> list[str]:
    """What the job will write under `trainer.default_local_dir` (empty: nothing, so its path does not matter):
    checkpoints, the file logger, tensorboard's event files (unless TENSORBOARD_DIR names their place), wandb's
    local files (unless WANDB_DIR does)."""
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
    if cfg.ray_init.timeline_json_file:
        paths["ray_init.timeline_json_file"] = (cfg.ray_init.timeline_json_file, "Ray's timeline is written there")
    loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    env_keys = (["TENSORBOARD_DIR"] if "tensorboard" in loggers else []) + (["WANDB_DIR"] if "wandb" in loggers
                                                                              else [])
    paths.update({f"the environment variable {k}": (os.environ.get(k), "logs go there") for k in env_keys})
    for key, (path, why) in paths.items():
        if path and not os.path.isabs(os.path.expanduser(path)):
            errors.append(f"{key}={path!r} is a relative path ({why}), and this driver runs as a Ray job in Ray's "
                          f"temporary copy of the working dir ({os.getcwd()}), deleted when the job ends. Fix: give "
                          f"an absolute path on the head node (or shared storage), e.g. {key.split()[-1]}="
                          f"/abs/path/{path.lstrip('./')}.")


def validate_config(cfg: RLXConfig) -> None:
    errors: list[str] = []
    _check_not_supported(cfg, errors)
    _check_offload(cfg, errors)
    _check_strategies(cfg, errors)
    _check_batch_sizes(cfg, errors)
    _check_long_sequences(cfg, errors)
    _check_sequence_parallel(cfg, errors)
    _check_lora(cfg, errors)
    _check_algorithm(cfg, errors)
    _check_rollout(cfg, errors)
    _check_reward(cfg, errors)
    _check_data_trainer(cfg, errors)
    _check_device(cfg, errors)
    _check_output_paths(cfg, errors)
    if errors:
        # de-duplicate, keep order
        seen = list(dict.fromkeys(errors))
        raise ValueError("Invalid rlx config:\n  - " + "\n  - ".join(seen))
