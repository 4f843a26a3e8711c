"""Fault matrix (issue 39): tools that misbehave, and the faults that end a run. Each row is a test that failed
before the change it names: sync function tools in killable worker processes (hung, runaway-printing,
process-ending tools), one `rlx:` line for a dead worker, a full disk, and a preflight that refuses a disk too small
for two checkpoints."""
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
