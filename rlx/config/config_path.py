"""Where `--config-path DIR --config-name NAME` finds its YAML, as verl's (Hydra's) command line does.

- A relative DIR is relative to the entry point's package, `rlx/trainer/` (Hydra's rule for `python -m`: verl's
  `--config-path=config` names verl's own config dir, so in rlx it names rlx's), then to the working directory.
- NAME may carry `.yaml`. It is looked up in DIR, then in rlx's config dir.
- Hydra's search path is DIR, then rlx's config dir, then the entries of the YAML's own `hydra.searchpath` that exist
  here. So a user's config whose `defaults` list names `ppo_trainer` (and `_self_`), the shape of verl's recipe and
  multi-turn configs, composes over rlx's ppo_trainer.yaml; an entry such as `file://verl/trainer/config` (verl's
  config dir, relative to a verl checkout) is dropped when it does not exist.
A directory or file that does not exist is a `ValueError` naming it (exit 2 on the command line).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "trainer" / "config"
ENTRY_POINT_DIR = CONFIG_DIR.parent  # rlx/trainer: where `python -m rlx.trainer.main_ppo` is declared


@dataclass
class ConfigLocation:
    """The directory Hydra starts from, the config's name (without .yaml) and the search path after it."""
    config_dir: Path
    config_name: str
    searchpath: list[str] = field(default_factory=list)

    def searchpath_override(self) -> list[str]:
        """The `hydra.searchpath=[...]` override that puts rlx's config dir right after the user's (none when the
        user's dir is rlx's)."""
        if not self.searchpath:
            return []
        quoted = ",".join("'" + p.replace("\\", "\\\\").replace("'", "\\'") + "'" for p in self.searchpath)
        return [f"hydra.searchpath=[{quoted}]"]


def _yaml_names(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def locate(config_dir: str | os.PathLike | None, config_name: str) -> ConfigLocation:
    """Resolve `--config-path` / `--config-name` (see the module docstring)."""
    name = str(config_name).removesuffix(".yaml")
    if not name:
        raise ValueError("--config-name is empty; give the YAML file's name, e.g. --config-name ppo_trainer")
    if config_dir is None:
        directory = CONFIG_DIR
    else:
        given = Path(os.path.expanduser(str(config_dir)))
        candidates = [given] if given.is_absolute() else [ENTRY_POINT_DIR / given, Path.cwd() / given]
        existing = [c.resolve() for c in candidates if c.is_dir()]
        if not existing:
            where = " or ".join(str(c) for c in candidates)
            raise ValueError(f"--config-path {config_dir}: no such directory ({where}). A relative path is relative "
                             f"to rlx/trainer/ (as Hydra takes it: --config-path=config is rlx's config dir), then "
                             f"to the working directory. Fix: give an existing directory, e.g. an absolute path.")
        with_file = [d for d in existing if (d / f"{name}.yaml").is_file()]
        directory = with_file[0] if with_file else existing[0]
    if not (directory / f"{name}.yaml").is_file() and not (CONFIG_DIR / f"{name}.yaml").is_file():
        where = f"{directory}" + ("" if directory == CONFIG_DIR else f" nor in rlx's config dir {CONFIG_DIR}")
        names = sorted(set(_yaml_names(directory)) | set(_yaml_names(CONFIG_DIR)))
        raise ValueError(f"--config-name {config_name}: no {name}.yaml in {where}. Configs found there: {names}.")
    if directory == CONFIG_DIR:
        return ConfigLocation(directory, name)
    searchpath = [f"file://{CONFIG_DIR}"] + _own_searchpath(directory / f"{name}.yaml")
    return ConfigLocation(directory, name, searchpath)


def _own_searchpath(path: Path) -> list[str]:
    """The `hydra.searchpath` entries of the user's YAML that exist on this machine (others are dropped)."""
    if not path.is_file():
        return []
    import yaml

    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return []  # Hydra reports an unreadable file when it composes
    entries = ((doc or {}).get("hydra") or {}).get("searchpath") if isinstance(doc, dict) else None
    kept = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, str):
            continue
        if entry.startswith("pkg://"):
            package = entry[len("pkg://"):].split("/")[0].split(".")[0]
            if package and importlib.util.find_spec(package) is not None:
                kept.append(entry)
            continue
        local = Path(os.path.expanduser(entry.removeprefix("file://")))
        if local.is_dir() and local.resolve() != CONFIG_DIR:
            kept.append(f"file://{local.resolve()}")
    return kept
