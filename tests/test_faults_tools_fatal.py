"""Fault matrix (issue 39): tools that misbehave, and the faults that end a run. Each row is a test that failed
before the change it names: sync function tools in killable worker processes (hung, runaway-printing,
process-ending tools), one `rlx:` line for a dead worker, a full disk, and a preflight that refuses a disk too small
for two checkpoints."""
from __future__ import annotations

import asyncio
import logging
import os
import time

import pytest

import faulty_tools
from rlx.workers.rollout.agent import tool_procs
from rlx.workers.rollout.agent.tools import call_tool, load_function_tools


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


@pytest.mark.e2e
def test_hung_sync_tools_are_killed_and_free_their_workers(tools, tmp_path, monkeypatch):
    """Before: a hung call kept its thread; 32 of them exhausted the pool and every later call timed out."""
    monkeypatch.setenv("RLX_TEST_PID_FILE", str(tmp_path / "pids"))
    hang, fast = by_name(tools, "hang"), by_name(tools, "pid_tool")
    hung = run(*(call_tool(hang, {"seconds": 600}, {}, 1.0) for _ in range(6)))  # more than the pool's 4
    assert all(r.error and "timed out after 1 s" in r.text for r in hung)
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 4  # two calls waited for a worker until their timeout and never started
    assert not any(alive(p) for p in pids)  # killed, not abandoned
    t0 = time.perf_counter()
    (ok,) = run(call_tool(fast, {}, {}, 5.0))
    assert not ok.error and int(ok.text) not in pids and time.perf_counter() - t0 < 5.0


@pytest.mark.e2e
def test_fast_sync_tools_reuse_their_worker_process(tools):
    fast = by_name(tools, "pid_tool")
    first = run(call_tool(fast, {}, {}, 10.0))[0]
    t0 = time.perf_counter()
    again = run(*(call_tool(fast, {}, {}, 10.0) for _ in range(20)))
    per_call = (time.perf_counter() - t0) / 20
    assert {r.text for r in again} <= set(map(str, tool_procs.pool().pids())) and first.text in {r.text for r in again}
    assert per_call < 0.05, per_call  # a round trip over a pipe (~1 ms), not a process start (~0.1 s)


@pytest.mark.e2e
def test_runaway_printing_tool_is_capped_and_killed(tools, caplog):
    """Before: a timed-out tool that printed forever kept printing from its thread: 2.3 GB of logs in 100 s."""
    caplog.set_level(logging.INFO, logger="rlx")
    chatty, forever = by_name(tools, "chatty"), by_name(tools, "print_forever")
    (said,) = run(call_tool(chatty, {"lines": 100_000}, {}, 30.0))
    assert not said.error and said.text == "said it"
    printed = [r.getMessage() for r in caplog.records if "'chatty' printed" in r.getMessage()]
    assert len(printed) == 1 and "line 0\n" in printed[0] and "more bytes dropped" in printed[0]
    assert len(printed[0]) < tool_procs.OUTPUT_LIMIT + 200
    t0 = time.perf_counter()
    (r,) = run(call_tool(forever, {}, {}, 1.0))
    assert r.error and "timed out" in r.text and time.perf_counter() - t0 < 3.0
    assert tool_procs.pool().pids() == []  # the one worker ran chatty, then print_forever, and was killed
    assert sum(len(x.getMessage()) for x in caplog.records) < 3 * tool_procs.OUTPUT_LIMIT


@pytest.mark.e2e
def test_tool_that_ends_its_process_is_named_and_its_trajectory_gets_an_error_reply(tools, caplog):
    """Before: `os._exit(1)` in a tool killed the rollout worker with Ray's generic message, the tool unnamed."""
    caplog.set_level(logging.WARNING, logger="rlx")
    dies, fast = by_name(tools, "exit_process"), by_name(tools, "pid_tool")
    (r,) = run(call_tool(dies, {}, {}, 10.0))
    assert r.error and r.text == "Error: tool 'exit_process' crashed: its process ended (exit code 1)"
    lines = [x.getMessage() for x in caplog.records]
    assert any(m.startswith("rlx: tool 'exit_process' ended its worker process (exit code 1)") for m in lines), lines
    (ok,) = run(call_tool(fast, {}, {}, 10.0))  # a fresh worker
    assert not ok.error and int(ok.text) != os.getpid()
