"""The roles a job builds and the engines it may run: pure functions of the config, written here once.

Validation reads them (it runs before the job plan exists); the job plan (rlx.plan) is built from them. The engine
names ("vllm", "hf") are compared here, in rlx.plan and in the rollout factory only; the role predicates are written
here only (tests/unit/test_plan.py checks both).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from rlx.config.device import vllm_available


Engine = Literal["vllm", "hf"]
VLLM: Engine = "vllm"
HF: Engine = "hf"
ENGINES: tuple[str, ...] = (VLLM, HF)
"""The generation engines (the values rollout.name resolves to; reward_model.rollout.name takes them too)."""


@dataclass(frozen=True)
class Roles:
    """The roles a job builds (the actor and its rollout always)."""
    ref: bool
    """A reference policy: a KL term needs its log-probs (actor.use_kl_loss or algorithm.use_kl_in_reward)."""
    critic: bool
    """A value model: only GAE (algorithm.adv_estimator=gae) trains one."""
    reward_model: bool
    """The reward model scores the responses: reward_model.enable, unless custom_reward_function.path scores instead
    (verl's precedence); a judge runs with a custom function too (the function reads its verdicts)."""
    judge: bool
    """The reward model is a generative judge (reward_model.judge.enable) and scores."""
    actor: bool = True
    """The policy, trained with FSDP (always)."""
    rollout: bool = True
    """The policy's generation engine (always; today in the actor's processes)."""


def plan_roles(cfg: Any) -> Roles:
    """The roles of `cfg` (pure; valid on a config that has not passed validation, which reads them)."""
    rm = cfg.reward_model
    scores = bool(rm.enable and (not cfg.custom_reward_function.path or rm.judge.enable))
    return Roles(ref=bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward),
                 critic=cfg.algorithm.adv_estimator == "gae", reward_model=scores,
                 judge=scores and bool(rm.judge.enable))


def reward_model_pool(cfg: Any) -> tuple[int, int] | None:
    """(nodes, GPUs per node) of the reward model's own pool (reward_model.enable_resource_pool with a reward model
    that scores; the values as given, validation checks them); None when it is colocated or there is none."""
    rm = cfg.reward_model
    if not (plan_roles(cfg).reward_model and rm.enable_resource_pool):
        return None
    assert rm.nnodes is not None and rm.n_gpus_per_node is not None  # both callers run after valid_pool
    return rm.nnodes, rm.n_gpus_per_node


def vllm_missing(name: str | None, vllm_installed: Callable[[], bool] = vllm_available) -> bool:
    """`name` (a rollout.name) asks for vLLM, which is not installed."""
    return name == VLLM and not vllm_installed()


def may_run_vllm(name: str | None) -> bool:
    """`name` (a rollout.name) may run vLLM: vllm, or auto where vLLM is installed."""
    return name != HF
