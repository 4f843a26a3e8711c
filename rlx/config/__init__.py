"""Typed config (schema), strict loading (loader) and cross-key validation (validate)."""
from rlx.config.loader import compose, load_config, to_typed
from rlx.config.schema import RLXConfig
from rlx.config.validate import validate_config

__all__ = ["RLXConfig", "compose", "load_config", "to_typed", "validate_config"]
