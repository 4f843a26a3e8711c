"""End-to-end half of tests/unit/test_rollout_memory.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
from conftest import spawn_per_strategy
from unit.test_rollout_memory import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    WORLD,
    _check_layered,
)


def test_layered_summon_same_weights_one_unit_at_a_time(tmp_path):
    spawn_per_strategy(_check_layered, str(tmp_path), WORLD)
