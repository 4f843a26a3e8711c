"""The config's rules that read the machine, run by the preflight before any worker starts (validation does no IO):
the model's files (layer and head counts from config.json, module names from a copy built on the meta device:
rlx.models.inspect), the packages a choice needs (vLLM, liger-kernel, triton, wandb, swanlab), the GPUs of
trainer.device=cuda, and the agent loop's and tools' files. Each message names the key, the value and the fix, as
validation's do.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rlx.config.fsdp import STRATEGIES
from rlx.config.model import sp_heads_problem
from rlx.config.reward_model import valid_pool
from rlx.config.roles import plan_roles, reward_model_pool, vllm_missing
from rlx.config.rules import built_roles, get_key
from rlx.models.inspect import installed, model_config, model_module_names, num_hidden_layers

if TYPE_CHECKING:
    from rlx.config.schema import RLXConfig


def machine_problems(cfg: RLXConfig) -> list[str]:
    """Every problem of `cfg` that the machine decides, one message each, in order."""
    errors: list[str] = []
    for check in (check_offload_layers, check_model_heads, check_kernels, check_head_backend, check_lora_modules,
                  check_vllm, check_judge_engine, check_loggers, check_agent_files, check_gpus):
        check(cfg, errors)
    return list(dict.fromkeys(errors))


def check_offload_layers(cfg, errors):
    """Activation offload needs at least 3 decoder layers (the model's config.json, or override_config)."""
    for role, model, strategy_key in (("actor", cfg.actor_rollout_ref.model, "actor_rollout_ref.actor.strategy"),
                                      ("critic", cfg.critic.model, "critic.strategy")):
        if not model.enable_activation_offload or get_key(cfg, strategy_key) not in STRATEGIES:
            continue  # off, or refused by validation
        if role == "critic" and not plan_roles(cfg).critic:
            continue  # no critic is built
        prefix = "actor_rollout_ref.model" if role == "actor" else "critic.model"
        layers = model.override_config.get("num_hidden_layers") or num_hidden_layers(model.path)
        if layers is not None and layers < 3:
            errors.append(f"{prefix}.enable_activation_offload=True needs a model with at least 3 decoder layers "
                          f"({prefix}.path={model.path!r} has {layers}). Fix: "
                          f"{prefix}.enable_activation_offload=False.")


def check_model_heads(cfg, errors):
    """Ulysses sp > 1 splits the model's attention heads (its config.json) over a group's ranks."""
    for role, prefix in built_roles(cfg):
        key = f"{role}.ulysses_sequence_parallel_size"
        sp, model = get_key(cfg, key), get_key(cfg, prefix)
        if not isinstance(sp, int) or isinstance(sp, bool) or sp <= 1:
            continue  # off, or refused by validation
        conf = model_config(model)
        heads = conf.get("num_attention_heads")
        if heads is None:
            continue
        problem = sp_heads_problem(key, sp, heads, conf.get("num_key_value_heads"), f"{prefix}.path={model.path!r}")
        if problem:
            errors.append(problem)


def check_kernels(cfg, errors):
    """Liger's kernels need the liger-kernel package (on a GPU: validation refuses them on the CPU)."""
    for role, prefix in built_roles(cfg):
        if role == "actor_rollout_ref.ref":
            continue  # the policy's model key: said once for the actor
        key = f"{prefix}.use_liger"
        if get_key(cfg, key) and cfg.trainer.device != "cpu" and not installed("liger_kernel"):
            errors.append(f"{key}=True needs the liger-kernel package. Fix: pip install liger-kernel, or {key}=False.")


def check_head_backend(cfg, errors):
    """fused_kernel_options.impl_backend=triton needs the package and a GPU (or Triton's interpreter)."""
    from rlx.config.device import triton_head_problem

    model = cfg.actor_rollout_ref.model
    if model.fused_kernel_options.impl_backend == "triton" and model.use_fused_kernels:  # the unfused head has none
        problem = triton_head_problem(cfg.trainer.device)
        if problem:
            errors.append(problem)


def check_lora_modules(cfg, errors):
    """LoRA's target_modules / exclude_modules name modules of the model (a copy built on the meta device)."""
    key, model = "actor_rollout_ref.model", cfg.actor_rollout_ref.model
    rank = model.lora_rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        return
    lists = {}
    for k in ("target_modules", "exclude_modules"):
        v = getattr(model, k)
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, str) and x for x in v):
            lists[k] = list(v)
    if not lists:
        return
    try:
        names = model_module_names(model.path, model.trust_remote_code)
    except Exception:  # noqa: BLE001 - an unreadable model is reported by the preflight's model check
        names = None
    if names is None:
        return
    linear = sorted({n.rsplit(".", 1)[-1] for n, c in names if c == "Linear"})
    for k, listed in lists.items():
        missing = [t for t in listed if not any(n == t or n.endswith("." + t) for n, _ in names)]
        if missing:
            errors.append(f"{key}.{k}={listed}: {missing} name no module of {model.path}; its linear modules "
                          f"are {linear}. Fix: name some of them, or {key}.target_modules=all-linear.")


def check_vllm(cfg, errors):
    """rollout.name=vllm needs vLLM installed (auto falls back to hf: rlx.plan)."""
    if vllm_missing(cfg.actor_rollout_ref.rollout.name):
        from rlx.config.device import VLLM_INSTALL_HINT
        errors.append(f"actor_rollout_ref.rollout.name=vllm but vLLM is not installed. {VLLM_INSTALL_HINT} "
                      f"Fix: install it as above, or actor_rollout_ref.rollout.name=hf.")


def check_judge_engine(cfg, errors):
    """A generative judge served by vLLM needs vLLM installed."""
    r = cfg.reward_model.rollout
    if plan_roles(cfg).judge and vllm_missing(r.name or cfg.actor_rollout_ref.rollout.name):
        from rlx.config.device import VLLM_INSTALL_HINT
        errors.append(f"the judge generates with vLLM (reward_model.rollout.name={r.name!r}, "
                      f"actor_rollout_ref.rollout.name={cfg.actor_rollout_ref.rollout.name!r}) but vLLM is not "
                      f"installed. {VLLM_INSTALL_HINT} Fix: install it as above, or reward_model.rollout.name=hf.")


def check_loggers(cfg, errors):
    """The loggers' packages: wandb (a dependency: missing only in a broken install) and swanlab (an extra)."""
    t = cfg.trainer
    loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    if "wandb" in loggers and not installed("wandb"):
        errors.append("trainer.logger includes wandb but wandb is not installed (a dependency of rlx). Fix: "
                      "pip install wandb, or drop it from trainer.logger.")
    if "swanlab" in loggers and not installed("swanlab"):
        errors.append("trainer.logger=swanlab needs the swanlab package, an optional extra of rlx that is not "
                      "installed. Fix: pip install swanlab (or pip install 'rlx[swanlab]'), or drop swanlab from "
                      "trainer.logger.")


def check_agent_files(cfg, errors):
    """The agent loop's registry and the tools' files exist."""
    r, key = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    for k in ("agent.agent_loop_config_path", "multi_turn.tool_config_path", "multi_turn.function_tool_path",
              "multi_turn.interaction_config_path"):
        path = get_key(r, k)
        if path and not os.path.isfile(os.path.expanduser(path)):
            errors.append(f"{key}.{k}={path!r} is not a file. Fix: {key}.{k}=<the path of an existing file>.")


def check_gpus(cfg, errors):
    """trainer.device=cuda: the GPUs the job wants are on this machine (a cluster's are checked when the workers
    are placed)."""
    from rlx.config.device import joins_cluster, visible_gpu_count

    t = cfg.trainer
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
    elif valid_pool(cfg) and reward_model_pool(cfg) is not None:
        rm = cfg.reward_model
        if rm.nnodes > 1:
            errors.append(f"reward_model.nnodes={rm.nnodes} needs a Ray cluster of that many nodes; this run starts a "
                          f"local Ray. Fix: ray_init.address=<head-ip>:6379, or reward_model.nnodes=1.")
        elif t.n_gpus_per_node + rm.n_gpus_per_node > gpus:
            errors.append(f"trainer.n_gpus_per_node={t.n_gpus_per_node} + reward_model.n_gpus_per_node="
                          f"{rm.n_gpus_per_node} (the reward model's own pool, reward_model.enable_resource_pool=True)"
                          f" but this machine has {gpus} GPU(s). Fix: fewer GPUs for either, or "
                          f"reward_model.enable_resource_pool=False (colocated).")
