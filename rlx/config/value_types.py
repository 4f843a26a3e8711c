"""A value of the wrong type for its key (`data.train_batch_size=abc`, a list where a number goes), said as one line:
the key, the value, the type the key takes (read from the schema's annotations) and the fix.

OmegaConf finds these when the composed config is merged into the schema (rlx.config.loader); its own message is
several lines of internals (`reference_type=DataConfig`) and no fix. `value_type_error` turns it into a
`ConfigValueError`, which the command line prints as one `rlx:` line before anything starts.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


class ConfigValueError(ValueError):
    """A config value of the wrong type: one line naming the key, the value, the type it takes and the fix."""


def _field_type(cls: type, dotted: str) -> tuple[Any, Any]:
    """(annotation, schema default) of the dotted key in the dataclass tree `cls`; (None, None) if it has none."""
    tp: Any = cls
    default: Any = cls()
    for part in dotted.split("."):
        if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
            return None, None
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return None, None
        tp, default = hints[part], getattr(default, part, None)
    return tp, default


def describe_type(tp: Any) -> str:
    """What a value of annotation `tp` is, in a user's words ('an integer', 'a number or null', ...)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        named = [describe_type(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    origin = typing.get_origin(tp) or tp
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):
        return "a section of keys"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            list: "a list ([a,b])", tuple: "a list ([a,b])", dict: "a mapping ({k: v})"}.get(origin, "another value")


def _shown(value: Any) -> str:
    """`value` as a command line writes it (None as null, strings quoted)."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(v if isinstance(v, str) else _shown(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def _section_given_a_value(node: DictConfig, cls: type, prefix: str = "") -> str | None:
    """The first key of `node` whose schema type is a section (a dataclass) but which holds a plain value."""
    hints = typing.get_type_hints(cls)
    for key in map(str, node.keys()):
        tp = hints.get(key)
        if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            found = _section_given_a_value(child, tp, f"{prefix}{key}.")
            if found:
                return found
        elif child is not None and not child._is_none():
            return f"{prefix}{key}"
    return None


def value_type_error(e: Exception, composed: DictConfig, schema: type) -> ValueError:
    """The user error for OmegaConf's `e`, raised while merging `composed` into `schema`: a ConfigValueError of one
    line when the key is known, else a ValueError with OmegaConf's first line and the key."""
    key = getattr(e, "full_key", None) or _section_given_a_value(composed, schema)
    first = str(getattr(e, "msg", e)).splitlines()[0] if str(e) else type(e).__name__
    tp, default = _field_type(schema, key) if key else (None, None)
    if not key or tp is None:
        return ValueError(f"Invalid config value{f' for {key!r}' if key else ''}: {first}")
    value = OmegaConf.select(composed, key, default=getattr(e, "value", None), throw_on_resolution_failure=False)
    value = value._value() if hasattr(value, "_value") else value  # an AnyNode
    wants = describe_type(tp)
    if wants == "a section of keys":
        fix = f"{key}.<name>=<value>, one key at a time (--cfg job -p {key} lists them)"
    else:
        fix = f"{key}=<{wants}>" + (f" (the default: {_shown(default)})" if default not in (None, {}) else "")
    return ConfigValueError(f"{key}={_shown(value)} is not valid: {key} takes {wants}. Fix: {fix}.")
