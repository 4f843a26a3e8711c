"""Compose the Hydra config, reject unknown keys with a suggestion, and build the typed config."""
from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rlx.config.config_path import CONFIG_DIR as CONFIG_DIR, locate  # CONFIG_DIR: re-exported
from rlx.config.schema import RLXConfig
from rlx.config.value_types import value_type_error


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
SECTION_KEYS = {k.rpartition(".")[0] for k in SCHEMA_KEYS} - {""}
# list-typed keys that verl scripts also write as a bare string (`trainer.logger=console`): taken as [value]
SCALAR_AS_LIST = ("trainer.logger",)


# Keys of verl's example scripts that verl 0.9.1's own config does not have either (its Hydra refuses them too): the
# unknown-key error says where the setting lives now, or why there is none. Prefix -> explanation.
NOT_IN_VERL = {
    "reward_model.sandbox_fusion": (
        "an older verl's place for the sandbox settings; verl 0.9.1 has them at reward.sandbox_fusion.* (legacy: "
        "sandbox_fusion.*), which rlx refuses by name (code-execution rewards through a SandboxFusion server are "
        "not implemented)"),
    "actor_rollout_ref.model.torch_dtype": (
        "verl 0.9.1 has no such key either; the policy's parameter dtype is "
        "actor_rollout_ref.actor.fsdp_config.model_dtype (and the rollout's actor_rollout_ref.rollout.dtype)"),
}


def _not_in_verl(key: str) -> str | None:
    for prefix, why in NOT_IN_VERL.items():
        if key == prefix or key.startswith(prefix + "."):
            return why
    return None


class OverrideParseError(ValueError):
    """A command-line argument that is not a `key=value` override (one line, names the argument)."""


class UnknownKeysError(ValueError):
    """Overrides naming keys the schema does not have: one message per key (`problems`), and the overrides without
    them (`known`), with which the rest of the command line can still be checked."""

    def __init__(self, problems: list[str], known: list[str]):
        self.problems, self.known = problems, known
        super().__init__(problems[0] if len(problems) == 1 else
                         "Unknown config keys:\n  - " + "\n  - ".join(problems))


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
    # a full key path, never a section: `trainer.foo` should point at a key one can set, not at `trainer`
    match = difflib.get_close_matches(key, sorted(SCHEMA_KEYS - SECTION_KEYS), n=1, cutoff=0.5)
    return match[0] if match else None


def _is_known(key: str) -> bool:
    if key in SCHEMA_KEYS:
        return True
    return any(key.startswith(free + ".") for free in FREE_DICT_KEYS)


def _missing_section(key: str) -> str | None:
    """The first part of `key`'s path that is not a section of the schema (None when its parent is one)."""
    parts = key.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if prefix not in SECTION_KEYS:
            return prefix
    return None


def unknown_key_error(key: str, shown: str | None = None) -> ValueError:
    shown = shown or key
    why = _not_in_verl(key)
    if why:
        return ValueError(f"Unknown config key '{shown}': rlx has no key '{key}': {why}. Fix: remove it.")
    section = _missing_section(key)
    if section is None:
        hint = suggest_key(key)
        msg = f"Unknown config key '{shown}': rlx has no key '{key}'."
    else:  # a whole section rlx does not have (verl's multi_turn, rollout_correction, ...): only a near-spelling helps
        what = "is a key (a value), not a section" if section in SCHEMA_KEYS else "is not a section rlx has"
        msg = f"Unknown config key '{shown}': '{section}' {what}, so rlx has no key '{key}'."
        match = difflib.get_close_matches(key, sorted(SCHEMA_KEYS - SECTION_KEYS), n=1, cutoff=0.85)
        hint = match[0] if match else None
    if hint:
        msg += f" Did you mean '{hint}'?"
    if shown.startswith("+"):
        msg += (" (A '+' prefix asks Hydra to add a new key; rlx refuses that so that a misspelled key cannot be"
                " silently ignored.)")
    msg += f" Fix: {hint}=<value>." if hint else " Fix: remove it (--cfg job prints every key rlx has)."
    return ValueError(msg)


def check_override_keys(overrides: list[str]) -> list[str]:
    """Reject overrides naming keys the schema does not have, before Hydra composes anything.

    Returns the overrides with keys inside free-form dicts (e.g. `model.override_config.x=1`) turned into
    Hydra's add-or-override form, so they work with or without verl's `+` prefix.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out, unknown, known = [], [], []
    for raw in overrides:
        key = parse_override(parser, raw).key_or_group
        if not (key.startswith("hydra.") or key == "hydra") and not _is_known(key):
            unknown.append(str(unknown_key_error(key, shown=raw.split("=", 1)[0])))
            continue
        known.append(raw)
        if key not in SCHEMA_KEYS and _is_known(key) and not raw.startswith("~"):
            raw = "++" + raw.lstrip("+")
        out.append(raw)
    if unknown:
        raise UnknownKeysError(unknown, known)
    return out


def _parse_error_reason(raw: str, hydra_msg: str) -> str:
    key, eq, value = raw.partition("=")
    bare_key = key.lstrip("+~")
    if not eq:
        return "it has no '=' (every override sets a value)"
    if not bare_key:
        return "the key before '=' is empty"
    if bare_key.startswith(".") or bare_key.endswith(".") or ".." in bare_key:
        return f"the key {bare_key!r} has an empty part between dots"
    for open_, close in ("[]", "{}", "()"):
        if value.count(open_) != value.count(close):
            return f"the value {value!r} has unbalanced brackets {open_} {close}"
    if "=" in value and not value[:1] in ("'", '"'):
        return f"the value {value!r} contains '='; quote it: {key}='{value}'"
    for line in hydra_msg.splitlines():  # Hydra's grammar message, minus its boilerplate lines
        line = line.strip()
        if line and not line.startswith(("Error parsing override", "See https")):
            return f"Hydra says: {line}"
    return "Hydra cannot parse it"


def parse_override(parser, raw: str):
    """One override through Hydra's grammar; a malformed one is an `OverrideParseError` naming it."""
    from hydra.errors import HydraException, OverrideParseException

    try:
        ov = parser.parse_override(raw)
    except (HydraException, OverrideParseException) as e:
        raise OverrideParseError(f"cannot parse override {raw!r}: {_parse_error_reason(raw, str(e))}. "
                                 f"Use key=value.") from None
    if not ov.key_or_group:
        raise OverrideParseError(f"cannot parse override {raw!r}: {_parse_error_reason(raw, '')}. Use key=value.")
    return ov


def _check_tree(node: DictConfig, prefix: str = "") -> None:
    for k in node.keys():
        path = prefix + str(k)
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
    return compose_with_hydra(overrides, config_dir, config_name, hydra=False)[0]


def compose_with_hydra(overrides: list[str] | None = None, config_dir: str | Path | None = None,
                       config_name: str = "ppo_trainer", hydra: bool = True) -> tuple[DictConfig, DictConfig | None]:
    """`compose`, also returning Hydra's own config node (what `--cfg hydra|all` prints) when `hydra`.

    `config_dir` / `config_name` are `--config-path` / `--config-name` (rlx.config.config_path: a user's YAML whose
    `defaults` name `ppo_trainer` composes over rlx's)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    where = locate(config_dir, config_name)
    overrides = check_override_keys(list(overrides or []))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(where.config_dir), version_base=None):
            cfg = hydra_compose(config_name=where.config_name, overrides=overrides + where.searchpath_override(),
                                return_hydra_config=hydra)
    except ConfigCompositionException as e:  # a defaults entry that names no file, an unreadable YAML
        raise ValueError(f"--config-name {where.config_name} (in {where.config_dir}): {e}".rstrip()) from None
    finally:
        GlobalHydra.instance().clear()
    hydra_cfg = None
    if hydra:
        with open_dict(cfg):
            hydra_cfg = cfg.pop("hydra")
    _check_tree(cfg)
    return cfg, hydra_cfg


def to_typed(cfg: DictConfig, notes: list[str] | None = None) -> RLXConfig:
    """Merge into the structured schema (type-checks values), turn verl's deprecated global micro-batch keys into
    their per-GPU keys (rlx.config.deprecated; its notes are appended to `notes`), resolve interpolations, build
    dataclasses."""
    from rlx.config.deprecated import derive_micro_batch_sizes

    merged = merge_schema(cfg)
    said = derive_micro_batch_sizes(merged)
    if notes is not None:
        notes.extend(said)
    try:
        OmegaConf.resolve(merged)
        typed = OmegaConf.to_object(merged)
    except Exception as e:  # omegaconf's errors name the key; re-raise as the user error it is
        raise value_type_error(e, merged, RLXConfig) from None
    assert isinstance(typed, RLXConfig)  # the object of a structured config: its dataclass
    return typed


def merge_schema(cfg: DictConfig) -> DictConfig:
    """The composed config merged into the structured schema (values type-checked, interpolations kept)."""
    cfg = cfg.copy()
    for key in SCALAR_AS_LIST:
        value = OmegaConf.select(cfg, key)
        if isinstance(value, str):
            OmegaConf.update(cfg, key, [value], force_add=True)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RLXConfig), cfg)
    except Exception as e:  # omegaconf's errors name the key: one line with the type it takes and the fix
        raise value_type_error(e, cfg, RLXConfig) from None
    assert isinstance(merged, DictConfig)  # a structured config merged with a mapping
    return merged


def load_config(overrides: list[str] | None = None, config_dir: str | Path | None = None,
                config_name: str = "ppo_trainer", validate: bool = True, notes: list[str] | None = None) -> RLXConfig:
    """What the command line (rlx.trainer.cli) does before anything starts: compose, check keys, type, validate. `notes`: a list that gets
    the `rlx: note:` lines of the load (deprecated keys taken as verl takes them)."""
    from rlx.config.device import resolve_device
    from rlx.config.reward import merge_reward_section
    from rlx.config.validate import validate_config

    # trainer.device=auto -> cuda|cpu
    cfg = resolve_device(to_typed(compose(overrides, config_dir, config_name), notes), notes=notes)
    merge_reward_section(cfg, RLXConfig())  # verl 0.9.1's reward.* keys act as the legacy keys they spell
    if validate:
        validate_config(cfg)
    return cfg
