"""What the sections' rules share: reading a dotted key, the messages of a closed choice and of a positive count,
the world size, the roles a job builds, and the one generic walker that checks every choice declared on a field.

A closed choice is declared on its field with `choice(default, CHOICES)` (field metadata; OmegaConf's structured
configs take no `Literal`), next to its docstring; `choice_errors` walks the whole config and reports each value
outside its choices. The choices are a tuple, or "module:NAME" for a registry that lives in a heavier module
(the algorithms'), read when the config is checked.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Iterator

from rlx.config.roles import plan_roles

CHOICES = "rlx_choices"
"""The field-metadata key of a closed choice."""
WHEN = "rlx_choices_when"
"""The field-metadata key of a predicate on the root config: the choice is checked only where it holds (a role
that is built)."""


def choice(default: Any = dataclasses.MISSING, choices: tuple | str = (), *, when: Callable | None = None,
           default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field whose value is one of `choices` (each item of it, for a list), checked by
    `choice_errors`."""
    metadata = {CHOICES: choices, WHEN: when}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _resolve(choices: tuple | str) -> tuple:
    if isinstance(choices, str):
        module, _, name = choices.partition(":")
        return tuple(getattr(importlib.import_module(module), name))
    return tuple(choices)


def declared_choices(obj, prefix: str = "") -> Iterator[tuple[str, Any, tuple, Callable | None]]:
    """(dotted key, value, choices, when) of every field of the dataclass tree `obj` declared with `choice`."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from declared_choices(value, f"{prefix}{f.name}.")
        elif CHOICES in f.metadata:
            yield f"{prefix}{f.name}", value, _resolve(f.metadata[CHOICES]), f.metadata[WHEN]


def choice_errors(cfg, errors: list[str]) -> None:
    """The generic walker: every declared choice whose value (or an item of its list) is not among its choices."""
    for key, value, choices, when in declared_choices(cfg):
        if when is not None and not when(cfg):
            continue
        for item in ([value] if isinstance(value, str) or not isinstance(value, (list, tuple)) else value):
            check_choice(errors, key, item, choices)


def get_key(cfg, dotted: str):
    """The value at a dotted key of the config tree."""
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_choice(errors, key, value, choices):
    if value not in choices:
        errors.append(f"{key}={value!r} is not valid; choose one of {list(choices)}. Fix: {key}=<one of them>.")


def check_positive(errors, key, value, what=""):
    if value is None or value <= 0:
        errors.append(f"{key}={value!r} must be a positive integer {what}. Fix: {key}=<a positive "
                      f"integer>.".replace(" .", "."))


def world_size(cfg) -> int:
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


SP_ROLES = (("actor_rollout_ref.actor", "actor_rollout_ref.model"),
            ("actor_rollout_ref.ref", "actor_rollout_ref.model"), ("critic", "critic.model"))


def built_roles(cfg):
    """(role key, model key prefix) of each role the job builds: the actor, the ref with a KL term, the critic
    with GAE."""
    roles = plan_roles(cfg)
    for role, model_prefix in SP_ROLES:
        if role == "actor_rollout_ref.ref" and not roles.ref:
            continue
        if role == "critic" and not roles.critic:
            continue
        yield role, model_prefix


def critic_built(cfg) -> bool:
    """A `when` of `choice`: the critic's keys count only when a critic is built."""
    return plan_roles(cfg).critic
