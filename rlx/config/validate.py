"""Every rule of the config, run on the driver before Ray starts; no IO (what needs the model's files, installed
packages or the GPUs is the preflight's: rlx.trainer.preflight, rlx.models.inspect).

The rules live with their sections (rlx.config.<section>.check_*), the closed choices on their fields
(rlx.config.rules.choice, checked by one walker); RULES runs them in order. Each rule adds a message naming the
keys, the bad values and the fix; all problems are reported together in one ValueError so a user fixes a command
line in one go.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from rlx.config import actor, actor_rollout_ref, agent, algorithm, data, fsdp, judge, model, profiler, reward_model
from rlx.config import rollout, trainer, verl_compat
from rlx.config.async_training import check_async_training
from rlx.config.rules import choice_errors

if TYPE_CHECKING:
    from rlx.config.schema import RLXConfig

RULES: tuple[Callable[[RLXConfig, list[str]], None], ...] = (
    choice_errors,  # every closed choice declared on a field
    verl_compat.check_not_supported,
    model.check_offload,
    fsdp.check_strategies,
    data.check_data,  # a non-positive data.train_batch_size, said before the sizes that divide it
    actor_rollout_ref.check_batch_sizes,
    model.check_long_sequences,
    model.check_sequence_parallel,
    fsdp.check_fsdp_size,
    actor_rollout_ref.check_timeout,
    model.check_kernels,
    model.check_lora,
    algorithm.check_algorithm,
    actor.check_policy_loss,
    algorithm.check_estimator_inputs,
    rollout.check_rollout,
    agent.check_agent,
    reward_model.check_reward,
    reward_model.check_reward_model,
    judge.check_judge,
    algorithm.check_sampling,
    trainer.check_trainer,
    data.check_data_keys,
    profiler.check_profiler,
    fsdp.check_mixed_precision,
    trainer.check_output_paths,
    lambda cfg, errors: errors.extend(check_async_training(cfg)),
)
"""The rules, in the order their messages are listed."""


def validate_config(cfg: RLXConfig) -> None:
    """Raise one ValueError listing every problem of `config_errors`."""
    errors = config_errors(cfg)
    if errors:
        raise ValueError("Invalid rlx config:\n  - " + "\n  - ".join(errors))


def config_errors(cfg: RLXConfig) -> list[str]:
    """Every problem of `cfg`, one message each (key, value, fix), in rule order, without repeats."""
    errors: list[str] = []
    for rule in RULES:
        rule(cfg, errors)
    return list(dict.fromkeys(errors))  # de-duplicated, in order
