"""`--check`: what a command line would run, printed after composition, validation and the preflight, before Ray.

`python -m rlx.trainer.main_ppo ... --check` answers "would this long command start, and what would it build?" with
the checks a run makes before Ray starts (the GPUs of `trainer.device=cuda` are this machine's, unless
`ray_init.address` / RAY_ADDRESS names the cluster the job will join). Exit 0 with the summary, or 2 with every
error; Ray is never started.

`check_before_ray` is also what a run does first: it collects the problems of every stage (unknown keys, the
cross-key rules, the preflight) instead of stopping at the first stage that finds one, so that a long command is
fixed in one round.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.config.schema import RLXConfig
    from rlx.plan import JobPlan
    from rlx.trainer.preflight import DriverInputs


@dataclass
class Checked:
    """What the checks before Ray found: the typed config, what the preflight built (None when anything failed),
    and every problem, by stage."""
    cfg: RLXConfig
    plan: JobPlan | None
    """The job plan (None when the config's rules failed before one could be made)."""
    inputs: DriverInputs | None
    config_errors: list[str] = field(default_factory=list)
    preflight_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.config_errors and not self.preflight_problems

    def report(self) -> str:
        """Every problem, config errors first, as `rlx: ...` blocks of `  - ` lines."""
        parts = []
        if self.config_errors:
            parts.append("rlx: config error\nInvalid rlx config:\n  - " + "\n  - ".join(self.config_errors))
        if self.preflight_problems:
            from rlx.trainer.preflight import PreflightError

            parts.append(f"rlx: {PreflightError(self.preflight_problems)}")
        return "\n".join(parts)


def check_before_ray(overrides: list[str], config_dir: str | None, config_name: str,
                     notes: list[str] | None = None, composed=None) -> Checked:
    """Compose, validate and run the preflight, keeping every problem: overrides naming unknown keys are reported
    and the rest of the command line is checked without them; a config that breaks cross-key rules still goes
    through the preflight. Raises (ValueError) only what stops composition itself: a malformed override, a value
    of the wrong type, a config file that does not compose. `composed(cfg)` is called once the config is composed."""
    from rlx.config import load_config
    from rlx.config.loader import UnknownKeysError
    from rlx.config.validate import config_errors
    from rlx.plan import make_plan
    from rlx.trainer.preflight import PreflightError, preflight

    errors: list[str] = []
    try:
        cfg = load_config(overrides, config_dir, config_name, validate=False, notes=notes)
    except UnknownKeysError as e:
        errors += e.problems
        try:
            cfg = load_config(e.known, config_dir, config_name, validate=False, notes=notes)
        except ValueError as rest:
            raise ValueError("Invalid rlx config:\n  - " + "\n  - ".join(errors + [str(rest)])) from None
    if composed is not None:  # the caller learns the config before the checks run (a signal's line names its folder)
        composed(cfg)
    errors += config_errors(cfg)
    problems: list[str] = []
    plan = inputs = None
    try:
        plan = make_plan(cfg)  # what the job runs (engines, roles, pools), resolved once
        inputs = preflight(cfg, plan)
    except PreflightError as e:
        problems = e.problems
    except Exception as e:  # noqa: BLE001 - a check tripping over a config already found wrong
        if not errors:
            raise
        problems = [f"the preflight stopped early ({type(e).__name__}: {e}), likely because of the config errors "
                    f"above. Fix: those first, then run --check again."]
    return Checked(cfg, plan, inputs if not (errors or problems) else None, errors, problems)


def devices(cfg: RLXConfig) -> str:
    """The device chosen and the GPUs the job wants against those present here (or on the cluster it joins)."""
    from rlx.config.device import joins_cluster, visible_gpu_count

    t = cfg.trainer
    ranks = t.nnodes * t.n_gpus_per_node
    where = "the Ray cluster it joins (ray_init.address / RAY_ADDRESS)" if joins_cluster(cfg) else "this machine"
    here = visible_gpu_count()
    if t.device == "cuda":
        return f"cuda: {ranks} GPU(s) wanted (trainer.nnodes x trainer.n_gpus_per_node), {here} visible here; " \
               f"the workers run on {where}"
    return f"cpu: {ranks} CPU worker process(es) per role on {where} ({os.cpu_count()} core(s) here); " \
           f"GPUs visible here: {here}"


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _micro(dynamic: bool, rows, tokens) -> str:
    return f"dynamic, {tokens} tokens per GPU" if dynamic else f"{rows} per GPU"


def _log_prob_micro(role) -> str:
    return _micro(role.log_prob_use_dynamic_bsz, role.log_prob_micro_batch_size_per_gpu,
                  role.log_prob_max_token_len_per_gpu)


def _offload(fsdp_cfg) -> str:
    parts = [name for name, on in (("params", fsdp_cfg.param_offload), ("optimizer", fsdp_cfg.optimizer_offload),
                                   ("CPUOffloadPolicy", fsdp_cfg.offload_policy)) if on]
    return "+".join(parts) if parts else "none"


def rollout_engine(cfg: RLXConfig, plan: JobPlan) -> str:
    """The plan's rollout engine, and why when rollout.name=auto chose it."""
    engine = plan.rollout.engine
    if cfg.actor_rollout_ref.rollout.name != "auto":
        return engine
    return f"{engine} (rollout.name=auto" + ("; vLLM is not installed here)" if plan.rollout.note else ")")


def describe(cfg: RLXConfig, plan: JobPlan, inputs: DriverInputs | None = None) -> str:
    """The roles, world, engines and memory settings a run of `cfg` would use (`plan`: its job plan), one line per
    topic."""
    from rlx.plan import ACTOR_GROUP, REWARD_MODEL_GROUP

    arr, alg, t = cfg.actor_rollout_ref, cfg.algorithm, cfg.trainer
    actor, ref, rollout, model = arr.actor, arr.ref, arr.rollout, arr.model
    placement = plan.placement
    ws = placement.pool_of(ACTOR_GROUP).world_size
    use_ref, use_critic = plan.roles.ref, plan.roles.critic
    lines = ["rlx: check passed: the command composes, validates and passes the preflight (Ray not started).",
             "What it would run:"]

    def row(topic: str, text: str) -> None:
        lines.append(f"  {topic:<12} {text}")

    kl = []
    if actor.use_kl_loss:
        kl.append(f"KL loss {actor.kl_loss_type} x {actor.kl_loss_coef}")
    if alg.use_kl_in_reward:
        kl.append(f"KL in reward {alg.kl_penalty} ({alg.kl_ctrl.type}, coef {alg.kl_ctrl.kl_coef})")
    row("algorithm", f"{alg.adv_estimator}, {rollout.n} response(s) per prompt, policy loss "
                     f"{actor.policy_loss.loss_mode}, {actor.loss_agg_mode}" + (f"; {'; '.join(kl)}" if kl else ""))
    dist = "nccl" if t.device == "cuda" else "gloo"
    own = ""
    if plan.roles.reward_model and placement.groups[REWARD_MODEL_GROUP] != placement.groups[ACTOR_GROUP]:
        rm_pool = placement.pool_of(REWARD_MODEL_GROUP)
        own = (f"; the reward model on its own {rm_pool.nnodes} node(s) x {rm_pool.gpus_per_node} = "
               f"{rm_pool.world_size} rank(s)")
    if plan.async_ is not None:
        from rlx.plan import ROLLOUT_POOL

        rp = placement.pools[ROLLOUT_POOL]
        own += (f"; the rollout on its own {rp.nnodes} node(s) x {rp.gpus_per_node} GPU(s) x {rp.ranks_per_bundle} "
                f"engine(s) each = {rp.world_size} rank(s)")
    row("world", f"{t.nnodes} node(s) x {t.n_gpus_per_node} = {ws} rank(s) per role, device {t.device} ({dist})"
        + own)
    row("devices", devices(cfg))
    roles = ["actor+rollout"]
    if use_ref:
        roles.append("ref (the actor's module with the LoRA adapters off)" if model.lora_rank else "ref")
    roles.append("critic" if use_critic else f"no critic ({alg.adv_estimator} trains none)")
    if not use_ref:
        roles.append("no ref (no KL term)")
    row("roles", ", ".join(roles))
    lora = f", LoRA rank {model.lora_rank} alpha {model.lora_alpha}" if model.lora_rank else ""
    row("model", f"{model.path}{lora}; remove padding {_on(model.use_remove_padding)}, fused head "
                 f"{_on(model.use_fused_kernels)}, gradient checkpointing {_on(model.enable_gradient_checkpointing)}, "
                 f"activation offload {_on(model.enable_activation_offload)}")
    row("actor", f"{actor.strategy}, sp {actor.ulysses_sequence_parallel_size}, mini-batch "
                 f"{actor.ppo_mini_batch_size} prompts, micro-batch "
                 f"{_micro(actor.use_dynamic_bsz, actor.ppo_micro_batch_size_per_gpu, actor.ppo_max_token_len_per_gpu)}"
                 f", offload {_offload(actor.fsdp_config)}, lr {actor.optim.lr}")
    row("rollout", f"{rollout_engine(cfg, plan)}, tp {plan.rollout.tensor_parallel_size}, log-prob micro-batch "
                   f"{_log_prob_micro(rollout)}, temperature {rollout.temperature}")
    if use_ref:
        row("ref", f"{ref.strategy}, sp {ref.ulysses_sequence_parallel_size}, log-prob micro-batch "
                   f"{_log_prob_micro(ref)}, offload {_offload(ref.fsdp_config)}")
    if use_critic:
        c = cfg.critic
        row("critic", f"{c.strategy}, sp {c.ulysses_sequence_parallel_size}, {c.model.path}, micro-batch "
                      f"{_micro(c.use_dynamic_bsz, c.ppo_micro_batch_size_per_gpu, c.ppo_max_token_len_per_gpu)}, "
                      f"offload {_offload(c.model.fsdp_config)}, activation offload "
                      f"{_on(c.model.enable_activation_offload)}")
    d = cfg.data
    data = f"prompt {d.max_prompt_length} + response {d.max_response_length} tokens, {d.train_batch_size} prompts " \
           f"per step"
    if inputs is not None and inputs.train_dataset is not None:
        steps_per_epoch = len(inputs.train_dataset) // d.train_batch_size
        total = t.total_training_steps or steps_per_epoch * t.total_epochs
        val = len(inputs.val_dataset) if inputs.val_dataset is not None else 0
        data += f"; train {len(inputs.train_dataset)} prompts ({steps_per_epoch} step(s) per epoch), val {val}; " \
                f"{total} training step(s)"
    row("data", data)
    ckpt = f"every {t.save_freq} step(s) to {t.default_local_dir}" if t.save_freq > 0 else "none (trainer.save_freq)"
    resume = inputs.resume_dir if inputs is not None and inputs.resume_dir else f"none ({t.resume_mode})"
    row("checkpoints", f"{ckpt}; resume from {resume}")
    row("loggers", ", ".join(t.logger))
    return "\n".join(lines)
