"""End-to-end half of tests/unit/test_lora_adapter.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
from unit.test_lora_adapter import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _round_trip,
)


def test_engine_starts_from_exported_adapter(tmp_path):
    from conftest import spawn_per_strategy

    spawn_per_strategy(_round_trip, str(tmp_path), 2)
