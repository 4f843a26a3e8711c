"""End-to-end half of tests/unit/test_batch_shaping.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import pytest
import torch
from conftest import free_port as _free_port
from unit.test_batch_shaping import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _worker,
)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_engines_shaping_and_fused_head_exact(strategy):
    from rlx.models import resolve_model_path

    resolve_model_path("builtin://tiny-qwen2")  # materialise once, before the ranks race for it
    torch.multiprocessing.spawn(_worker, args=(2, _free_port(), strategy), nprocs=2, join=True)
