"""The rollout and memory keys (docs/rollout_memory.md): rollout.layered_summon (one FSDP unit gathered at a time,
the same merged weights), model.use_shm / data.use_shm (loaded from a copy in shared memory), the unfused head's
entropy_from_logits_with_chunking / entropy_checkpointing (the same values and gradients), and the config of the
keys that are accepted without changing anything (multi_stage_wake_up, checkpoint_engine's bucket size)."""
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
