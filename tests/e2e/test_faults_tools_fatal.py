"""End-to-end half of tests/unit/test_faults_tools_fatal.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import contextlib
import logging
import os
import re
import time
import pytest
from rlx.workers.rollout.agent import tool_procs
from rlx.workers.rollout.agent.tools import call_tool
from unit.test_faults_tools_fatal import alive, by_name, run
from unit.test_faults_tools_fatal import tools  # noqa: F401 -- fixtures


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


def _in_workers(trainer, path, name, ranks=None):
    """`fail_writes(path, name)` in the actor's worker processes (every rank, or `ranks`): below their real save."""
    import ray
    import write_faults.sitecustomize as faults

    ray.cloudpickle.register_pickle_by_value(faults)  # the workers cannot import tests/
    workers = trainer.actor.workers if ranks is None else [trainer.actor.workers[r] for r in ranks]
    ray.get([w.__ray_call__.remote(lambda _, p, n: faults.fail_writes(p, n), path, name) for w in workers])


@pytest.mark.e2e
def test_a_save_the_disk_refuses_is_one_error_naming_the_step_and_the_cause_and_the_steps_before_stay_whole(
        ray_local, tmp_path):
    """The real trainer's save (its worker groups, torch.distributed.checkpoint, the driver's files) with the disk's
    OSError raised where files are opened for writing: full (ENOSPC), read-only (EROFS), failing (EIO), in the workers
    or in the driver, on every rank or on one. Before: an AttributeError out of the trainer's own handler (a 125-line
    chained traceback)."""
    import time

    import write_faults.sitecustomize as faults
    from conftest import load_config
    from rlx.checkpoint import space, store
    from rlx.checkpoint.errors import CheckpointSaveError
    from rlx.plan import make_plan
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    root = str(tmp_path / "ckpt")
    cfg = load_config([f"trainer.default_local_dir={root}", "trainer.save_freq=1",
                       "actor_rollout_ref.nccl_timeout=120"])
    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    trainer.init_workers()
    d1, d2 = store.step_dir(root, 1), store.step_dir(root, 2)

    def refused(step, path, name, where=("workers", "driver"), ranks=None) -> str:
        trainer.global_step = step
        if "workers" in where:
            _in_workers(trainer, path, name, ranks)
        if "driver" in where:
            faults.fail_writes(path, name)
        try:
            with pytest.raises(CheckpointSaveError) as e:
                trainer.save_checkpoint()
        finally:
            faults.fail_writes(None)
            if "workers" in where:
                _in_workers(trainer, None, name, ranks)
        assert not os.path.exists(store.step_dir(root, step))  # the partial step is gone
        return str(e.value)

    try:
        estimate = space.estimate(cfg, trainer.plan).total
        msg = refused(1, root, "ENOSPC")
        assert msg.startswith(f"disk full while saving the checkpoint of step 1 to {d1}: it needs about "
                              f"{space.human(estimate)}, ") and " are free on that disk. Fix: free space there" in msg
        assert store.list_steps(root) == []

        trainer.global_step = 1
        trainer.save_checkpoint()  # the disk works again
        assert store.list_steps(root) == [1] and store.verify(d1) == []
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(d1) for f in fs)

        msg = refused(2, d2, "ENOSPC", where=("workers",))
        assert msg.startswith(f"disk full while saving the checkpoint of step 2 to {d2}: it needs about "
                              f"{space.human(size)}, "), msg
        msg = refused(2, root, "EROFS")
        assert msg == (f"read-only file system while saving the checkpoint of step 2 to {d2}: nothing can be "
                       f"written there. Fix: make that disk writable (remount it read-write), then run the same "
                       f"command again (or move trainer.default_local_dir, with its checkpoints, to a writable "
                       f"disk)."), msg
        msg = refused(2, os.path.join(d2, "driver_state.json"), "EIO", where=("driver",))
        assert msg.startswith(f"Input/output error (EIO) while saving the checkpoint of step 2 to {d2} (at "
                              f"driver_state.json.tmp.{os.getpid()}). Fix: check that disk"), msg
        assert store.list_steps(root) == [1] and store.verify(d1) == [] and store.find_resume_dir(cfg.trainer) == d1

        # rank 0 alone writes meta.json: rank 1 waits for it in the save's last barrier, which it never reaches
        start = time.monotonic()  # (nccl_timeout=120 above: a driver that waited for the barrier fails here)
        msg = refused(2, os.path.join(d2, "actor", "meta.json"), "EIO", where=("workers",), ranks=[0])
        assert time.monotonic() - start < 60, "the driver waited for the barrier's timeout"
        assert msg.startswith(f"Input/output error (EIO) while saving the checkpoint of step 2 to {d2} (at "
                              f"actor/meta.json.tmp."), msg
        assert store.list_steps(root) == [1] and store.verify(d1) == []
    finally:
        faults.fail_writes(None)
        trainer.shutdown()


@contextlib.contextmanager
def _small_disk(path, size: int):
    """A real tmpfs of `size` bytes mounted at `path` (a folder), or None where this process may not mount one."""
    import subprocess

    os.makedirs(path)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.e2e
def test_a_full_disk_during_a_save_ends_the_command_in_one_line_and_the_same_command_resumes(tmp_path):
    """`main_ppo` on a disk with room for one checkpoint, not two: a real tmpfs where the test may mount one (the
    preflight's estimate passes; the real step 1 is larger), else ENOSPC raised where the run's processes open the
    files of step 2 (tests/write_faults). Before: a 125-line chained traceback ending in an AttributeError."""
    import subprocess
    import sys

    from conftest import REPO, load_config
    from rlx.checkpoint import space, store
    from rlx.plan import make_plan

    args = ["trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.test_freq=-1",
            "trainer.val_before_train=False", "trainer.logger=console"]
    cfg = load_config(args)
    estimate = space.estimate(cfg, make_plan(cfg)).total
    with _small_disk(tmp_path / "disk", 2 * estimate + (64 << 10)) as disk:
        root = str((disk or tmp_path) / "ckpt")
        command = [sys.executable, "-m", "rlx.trainer.main_ppo", "--config-name", "quickstart", *args,
                   f"trainer.default_local_dir={root}"]
        d1, d2 = store.step_dir(root, 1), store.step_dir(root, 2)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "write_faults"), REPO]))
        if disk is None:
            env["RLX_TEST_WRITE_FAULT"] = f"ENOSPC:{d2}"
        first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
        lines = first.stderr.strip().splitlines()
        assert first.returncode == 1, first.stderr[-3000:]
        assert "Traceback" not in first.stderr + first.stdout, first.stderr[-3000:]
        assert [x for x in lines if x.startswith("rlx: training")] == lines[-1:], lines
        assert re.fullmatch(
            rf"rlx: training stopped: disk full while saving the checkpoint of step 2 to {re.escape(d2)}: it needs "
            rf"about [0-9.]+ MB, [0-9.]+ [KMG]?B are free on that disk\. Fix: free space there, then run the same "
            rf"command again \(or move trainer\.default_local_dir, with its checkpoints, to a larger disk\)\. The "
            rf"last complete checkpoint, {re.escape(d1)}, is kept: the same command resumes from it "
            rf"\(trainer\.resume_mode=auto\)\.", lines[-1]), lines[-1]
        assert store.list_steps(root) == [1] and store.verify(d1) == [] and not os.path.exists(d2)

        if disk is None:  # the disk has room again
            del env["RLX_TEST_WRITE_FAULT"]
        else:
            subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
        assert again.returncode == 0, again.stderr[-3000:]
        trained = [x.split()[0] for x in again.stdout.splitlines() if x.startswith("step:")]
        assert trained == ["step:2"], again.stdout[-3000:]  # resumed after step 1
        assert store.list_steps(root) == [1, 2] and store.verify(d2) == []


@pytest.mark.e2e
def test_a_sigkilled_worker_ends_the_run_with_one_line(tmp_path):
    """Before: exit 1 with a 49-line Ray traceback, no `rlx:` line, no role or rank, no word of the checkpoint."""
    import signal
    import subprocess
    import sys

    import psutil

    from conftest import REPO
    from rlx import checkpoint as ckpt

    root = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlx.trainer.main_ppo", "--config-name", "quickstart", "trainer.total_training_steps=100",
         "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.val_before_train=False", "trainer.logger=console",
         f"trainer.default_local_dir={root}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("step:2 "):
                break
        assert proc.poll() is None, proc.stderr.read()
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if p.cmdline() and p.cmdline()[0].startswith("ray::ActorRolloutRefWorker")]
        assert len(workers) == 2, workers
        victim = workers[1]
        victim.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1, err[-3000:]
    assert last.startswith("rlx: training stopped at step ") and "a worker died: actor_rollout_ref rank " in last, \
        err[-3000:]
    assert f"(pid {victim.pid})" in last and " on node " in last and "its log: " in last
    steps = ckpt.list_steps(str(root))
    assert steps and f"The last complete checkpoint, {ckpt.step_dir(str(root), steps[-1])}, is kept" in last
