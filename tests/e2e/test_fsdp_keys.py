"""End-to-end half of tests/unit/test_fsdp_keys.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import torch
from conftest import free_port
from unit.test_fsdp_keys import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    TIMEOUT_S,
    _late_collective,
)


def test_nccl_timeout_is_the_actor_groups_timeout(tmp_path):
    """nccl_timeout=3: a collective that one rank never joins fails after about 3 s (the default would wait 600)."""
    out = str(tmp_path / "result")
    torch.multiprocessing.spawn(_late_collective, args=(free_port(), out), nprocs=2, join=True)
    result, seconds = open(out).read().rsplit(" ", 1)
    assert result.startswith("raised"), result
    assert TIMEOUT_S - 0.5 <= float(seconds) < 3 * TIMEOUT_S, seconds
