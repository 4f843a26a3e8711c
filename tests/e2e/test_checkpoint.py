"""End-to-end half of tests/unit/test_checkpoint.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
from conftest import spawn_per_strategy
from unit.test_checkpoint import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    WORLD,
    _check,
)


def test_resume_exact_hf_export_and_crash(tmp_path, monkeypatch):
    """FSDP1 then FSDP2 in the same two processes (spawning and importing transformers dominate on CPU)."""
    from rlx.models import resolve_model_path

    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))  # a private built-in model, inherited by the ranks
    resolve_model_path("builtin://tiny-qwen2")
    spawn_per_strategy(_check, str(tmp_path / "ckpt"), WORLD)
