"""End-to-end half of tests/unit/test_checkpoint_safety.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import pytest
import torch
from unit.test_checkpoint_safety import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _fsdp1_optimizer_ranks,
    _two_ranks,
)


@pytest.mark.parametrize("where", ["optim_metadata", "optim_byte_item"])
def test_every_rank_refuses_a_planted_optimizer(tmp_path, where):
    """Under collectives (2 gloo ranks), as the workers load: each rank raises the refusal itself (not DCP's
    wrapped CheckpointException), and nothing runs."""
    from conftest import free_port

    torch.multiprocessing.spawn(_two_ranks, args=(2, free_port(), str(tmp_path), where), nprocs=2, join=True)


def test_a_rank_without_state_for_some_parameters_still_loads_its_param_groups(tmp_path):
    """DCP's own planner, on an FSDP1 rank that holds no state for some parameters, switched to the key format of
    checkpoints before torch 2.4 and, loading partially, silently kept that rank's fresh param_groups (its lr)."""
    from conftest import free_port

    torch.multiprocessing.spawn(_fsdp1_optimizer_ranks, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
