"""actor_rollout_ref.model.lora_adapter_path: LoRA starts from a saved peft adapter (verl's key), on the built-in tiny
model: the adapter's rank, alpha, targets and weights are taken; a mismatch is an error naming the key."""
from __future__ import annotations
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
from unit.test_lora_adapter import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _round_trip,
)


def test_engine_starts_from_exported_adapter(tmp_path):
    from conftest import spawn_per_strategy

    spawn_per_strategy(_round_trip, str(tmp_path), 2)
