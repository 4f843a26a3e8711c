"""Typed config (schema), strict loading (loader) and cross-key validation (validate).

Imports are lazy so that `rlx.config.schema` (plain dataclasses) loads without Hydra/OmegaConf, e.g. on a GPU
box that runs the engines under torchrun without them.
"""
_EXPORTS = {"RLXConfig": "rlx.config.schema", "compose": "rlx.config.loader", "load_config": "rlx.config.loader",
            "to_typed": "rlx.config.loader", "validate_config": "rlx.config.validate"}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
