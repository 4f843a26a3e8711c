"""Compose the Hydra config, reject unknown keys with a suggestion, and build the typed config."""
from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlx.config.schema import RLXConfig

CONFIG_DIR = Path(__file__).resolve().parent.parent / "trainer" / "config"


def _schema_keys(cls=RLXConfig, prefix: str = "") -> tuple[set[str], set[str]]:
    """All dotted keys of the schema, and the subset whose values are free-form dicts."""
    keys, free = set(), set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        keys.add(path)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            sub_keys, sub_free = _schema_keys(tp, path + ".")
            keys |= sub_keys
            free |= sub_free
        elif tp is dict or typing.get_origin(tp) is dict:
            free.add(path)
    return keys, free


SCHEMA_KEYS, FREE_DICT_KEYS = _schema_keys()


def suggest_key(key: str) -> str | None:
    """The closest valid key: first among siblings by leaf name, then over all keys."""
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in SCHEMA_KEYS if k.rpartition(".")[0] == parent}
    match = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    if match:
        return siblings[match[0]]
    # the same leaf name elsewhere (e.g. a key placed under the wrong section)
    same_leaf = sorted(k for k in SCHEMA_KEYS if k.endswith("." + leaf) or k == leaf)
    if same_leaf:
        return same_leaf[0]
    match = difflib.get_close_matches(key, sorted(SCHEMA_KEYS), n=1, cutoff=0.5)
    return match[0] if match else None


def _is_known(key: str) -> bool:
    if key in SCHEMA_KEYS:
        return True
    return any(key.startswith(free + ".") for free in FREE_DICT_KEYS)


def unknown_key_error(key: str, shown: str | None = None) -> ValueError:
    shown = shown or key
    hint = suggest_key(key)
    msg = f"Unknown config key '{shown}': rlx has no key '{key}'."
    if hint:
        msg += f" Did you mean '{hint}'? Fix: {hint}=<value>"
    if shown.startswith("+"):
        msg += (" (a '+' prefix asks Hydra to add a new key; rlx refuses that so that a misspelled key cannot be"
                " silently ignored)")
    return ValueError(msg)


def check_override_keys(overrides: list[str]) -> list[str]:
    """Reject overrides naming keys the schema does not have, before Hydra composes anything.

    Returns the overrides with keys inside free-form dicts (e.g. `model.override_config.x=1`) turned into
    Hydra's add-or-override form, so they work with or without verl's `+` prefix.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    out = []
    for ov, raw in zip(parsed, overrides):
        key = ov.key_or_group
        if not (key.startswith("hydra.") or key == "hydra") and not _is_known(key):
            raise unknown_key_error(key, shown=raw.split("=", 1)[0])
        if key not in SCHEMA_KEYS and _is_known(key) and not raw.startswith("~"):
            raw = "++" + raw.lstrip("+")
        out.append(raw)
    return out


def _check_tree(node: DictConfig, prefix: str = "") -> None:
    for k in node.keys():
        path = f"{prefix}{k}"
        if not _is_known(path):
            raise unknown_key_error(path)
        if path in FREE_DICT_KEYS:
            continue
        child = node._get_node(k)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            _check_tree(child, path + ".")


def compose(overrides: list[str] | None = None, config_dir: str | Path | None = None,
            config_name: str = "ppo_trainer") -> DictConfig:
    """Hydra compose of the YAML plus overrides, with rlx's strict key check."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = check_override_keys(list(overrides or []))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(config_dir or CONFIG_DIR).resolve()), version_base=None):
        cfg = hydra_compose(config_name=config_name, overrides=overrides)
    _check_tree(cfg)
    return cfg


def to_typed(cfg: DictConfig) -> RLXConfig:
    """Merge into the structured schema (type-checks values), resolve interpolations, build dataclasses."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RLXConfig), cfg)
        OmegaConf.resolve(merged)
        return OmegaConf.to_object(merged)
    except Exception as e:  # omegaconf's errors name the key; re-raise as the user error it is
        key = getattr(e, "full_key", None)
        raise ValueError(f"Invalid config value{f' for {key!r}' if key else ''}: {e}") from None


def load_config(overrides: list[str] | None = None, config_dir: str | Path | None = None,
                config_name: str = "ppo_trainer", validate: bool = True) -> RLXConfig:
    """What `main_ppo` does before anything starts: compose, check keys, type, validate."""
    from rlx.config.validate import validate_config

    cfg = to_typed(compose(overrides, config_dir, config_name))
    if validate:
        validate_config(cfg)
    return cfg
