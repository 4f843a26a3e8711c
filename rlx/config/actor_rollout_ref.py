"""`actor_rollout_ref`: the policy's model, actor, ref and rollout, and the rules that span them (batch sizes,
the process-group timeout).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.actor import ActorConfig, RefConfig
from rlx.config.model import ModelConfig
from rlx.config.roles import plan_roles
from rlx.config.rollout import RolloutConfig
from rlx.config.rules import check_positive, get_key, world_size


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


def check_timeout(cfg, errors):
    t = cfg.actor_rollout_ref.nccl_timeout
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
        errors.append(f"actor_rollout_ref.nccl_timeout={t!r} must be a positive number of seconds (verl's default: "
                      f"600). Fix: actor_rollout_ref.nccl_timeout=600.")


def check_batch_sizes(cfg, errors):
    ws = world_size(cfg)
    n = cfg.actor_rollout_ref.rollout.n
    tbs = cfg.data.train_batch_size
    if ws < 1:
        errors.append(f"trainer.nnodes * trainer.n_gpus_per_node must be >= 1, got {ws}. Fix: trainer.nnodes=1 "
                      f"trainer.n_gpus_per_node=<GPUs (or CPU workers) per node>.")
        return
    if tbs <= 0:
        return  # data.check_data says it, plainly; the sizes below divide it
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
        if mini <= 0:
            errors.append(f"{prefix}.ppo_mini_batch_size={mini} must be a positive integer (prompts per optimizer "
                          f"step). Fix: {prefix}.ppo_mini_batch_size=<a divisor of data.train_batch_size={tbs}>.")
            continue
        if tbs % mini:
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
            check_positive(errors, f"{prefix}.ppo_max_token_len_per_gpu", role.ppo_max_token_len_per_gpu,
                      f"(the token budget of {prefix}.use_dynamic_bsz=True)")
        elif micro is None or micro <= 0:
            errors.append(f"{prefix}.ppo_micro_batch_size_per_gpu={micro!r} must be a positive integer. Fix: set it "
                          f"(e.g. 4), or {prefix}.use_dynamic_bsz=True with {prefix}.ppo_max_token_len_per_gpu.")
    log_prob_roles = [("actor_rollout_ref.rollout", "log_prob_use_dynamic_bsz")]
    if built.ref:  # (as verl asks)
        log_prob_roles.append(("actor_rollout_ref.ref", "log_prob_use_dynamic_bsz"))
    for prefix, dyn in log_prob_roles:
        if get_key(cfg, f"{prefix}.{dyn}"):
            check_positive(errors, f"{prefix}.log_prob_max_token_len_per_gpu",
                      get_key(cfg, f"{prefix}.log_prob_max_token_len_per_gpu"), f"(the token budget of {prefix}.{dyn})")
            continue
        key = f"{prefix}.log_prob_micro_batch_size_per_gpu"
        value = get_key(cfg, key)
        if value is None or value <= 0:
            errors.append(f"{key}={value!r} must be a positive integer. Fix: set it (e.g. 8), or {prefix}.{dyn}=True.")
    if built.critic:
        c = cfg.critic
        if c.use_dynamic_bsz:
            check_positive(errors, "critic.forward_max_token_len_per_gpu", c.forward_max_token_len_per_gpu,
                      "(the token budget of critic.use_dynamic_bsz=True)")
        elif c.forward_micro_batch_size_per_gpu is None or c.forward_micro_batch_size_per_gpu <= 0:
            errors.append(f"critic.forward_micro_batch_size_per_gpu={c.forward_micro_batch_size_per_gpu!r} must be a "
                          f"positive integer. Fix: set it (e.g. 8), or critic.use_dynamic_bsz=True.")
