"""Fault matrix (issue 39): tools that misbehave, and the faults that end a run. Each row is a test that failed
before the change it names: sync function tools in killable worker processes (hung, runaway-printing,
process-ending tools), one `rlx:` line for a dead worker and for a save the disk refuses, and a preflight that refuses
a disk too small for two checkpoints."""
from __future__ import annotations

import asyncio
import os

import pytest

import faulty_tools
from rlx.workers.rollout.agent import tool_procs
from rlx.workers.rollout.agent.tools import load_function_tools


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def tools(monkeypatch):
    """The tools of tests/faulty_tools.py (loaded as `multi_turn.function_tool_path` loads them) on a pool of 4
    worker processes of this test's own."""
    pool = tool_procs.ToolProcessPool(max_processes=4)
    monkeypatch.setattr(tool_procs, "_POOL", pool)
    yield load_function_tools(faulty_tools.__file__)
    pool.close()


def by_name(tools, name):
    return next(t for t in tools if t.name == name)


def run(*calls):
    async def go():
        return await asyncio.gather(*calls)
    return asyncio.run(go())


# ---- faults that end a run: one `rlx:` line each ------------------------------------------------------------
def test_preflight_refuses_a_disk_without_room_for_two_checkpoints(monkeypatch, tmp_path):
    """Before: the preflight checked that the folder was writable, not that it had room."""
    import shutil
    from collections import namedtuple

    from conftest import load_config
    from rlx.checkpoint import space as checkpoint_space
    from rlx.plan import make_plan
    from rlx.trainer.preflight import _check_disk_space

    cfg = load_config([f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.save_freq=5"])
    plan = make_plan(cfg)
    size = checkpoint_space.estimate(cfg, plan)
    assert set(size.parts) == {"actor model", "actor optimizer", "actor hf_model"}  # rlx's actor default
    assert size.parts["actor optimizer"] == 2 * size.parts["actor model"] > 0
    usage = namedtuple("usage", "total used free")
    problems: list[str] = []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 ** 12, 0, 2 * size.total))
    _check_disk_space(cfg, plan, problems)
    assert problems == []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 ** 12, 0, 2 * size.total - 1))
    _check_disk_space(cfg, plan, problems)
    assert len(problems) == 1 and "trainer.default_local_dir=" in problems[0] and str(tmp_path) in problems[0]
    assert "a checkpoint of this job takes about" in problems[0] and "Fix:" in problems[0], problems
    problems.clear()
    _check_disk_space(load_config([f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.save_freq=-1"]), plan,
                      problems)
    assert problems == []  # nothing saved, nothing needed


def test_a_failed_save_is_read_from_the_oserror_behind_it(tmp_path):
    """A chain as a worker's failure reaches the driver: an error caused by torch.distributed.checkpoint's per-rank
    failures around the OSError (the e2e test has Ray's own). Only an OSError (or torch's zip writer's words for a
    full disk) is the disk's fault; anything else is a bug and keeps its traceback (None)."""
    import errno

    from torch.distributed.checkpoint.api import CheckpointException

    from rlx.checkpoint.space import DiskFullError, save_error

    d = str(tmp_path / "global_step_3")

    def from_worker(err):
        outer = RuntimeError("save_checkpoint failed")
        outer.__cause__ = CheckpointException("save", {0: (err, None)})
        return outer

    def line(err, needed=lambda: 10 ** 6):
        e = save_error(from_worker(err), d, 3, needed)
        return e and str(e)

    full = save_error(from_worker(OSError(errno.ENOSPC, "No space left on device")), d, 3, lambda: 10 ** 6)
    assert isinstance(full, DiskFullError) and str(full).startswith(
        f"disk full while saving the checkpoint of step 3 to {d}: it needs about 1.0 MB, ")
    assert line(OSError(errno.EROFS, "Read-only file system")).startswith(
        f"read-only file system while saving the checkpoint of step 3 to {d}: nothing can be written there. Fix: ")
    assert line(OSError(errno.EIO, "Input/output error", f"{d}/actor/model/__1_0.distcp")).startswith(
        f"Input/output error (EIO) while saving the checkpoint of step 3 to {d} (at actor/model/__1_0.distcp). Fix: ")
    zip_writer = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0: file write failed")
    assert line(zip_writer, lambda: 10 ** 18).startswith("disk full while saving")  # more than is free
    assert line(zip_writer) is None and line(ValueError("a bug")) is None
