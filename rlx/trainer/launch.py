"""Launch a job on Ray: join or start Ray, train, and stop cleanly whatever ends the run (`run`).

SIGTERM (what schedulers send) unwinds the driver like Ctrl-C (`Terminated`) whenever it comes (the handler is the
command's, taken back from Ray after `ray.init`), so the workers and a Ray started here stop without a stack dump;
their cleanup is never cut short. `ray_init.timeline_json_file` gets Ray's task timeline at the end.
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.config.schema import RLXConfig
    from rlx.plan import JobPlan
    from rlx.trainer.preflight import DriverInputs

log = logging.getLogger("rlx")


def init_ray(cfg: RLXConfig, plan: JobPlan) -> None:
    """Join the cluster named by ray_init.address (`auto` or host:port) / RAY_ADDRESS, else start a new local Ray.

    Local means local: without an address, `ray.init(address="local")` starts a private Ray even when Ray's temp
    folder names a cluster (a `ray start` of this machine, or a stale file of a stopped one), which a bare
    `ray.init()` would join. A local Ray with trainer.device=cpu declares at least one CPU per worker slot (each
    slot is a placement-group bundle of one CPU: the bundles of all of `plan`'s pools).
    No runtime env is passed here: `WorkerGroup` gives every worker the environment it needs, so nothing can
    clash with the runtime env of a `ray job submit`.
    """
    import ray

    if ray.is_initialized():
        return
    address = cfg.ray_init.address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":  # join the existing cluster; never start a second, local one
        ray.init(address=address)
        return
    num_cpus = cfg.ray_init.num_cpus
    if num_cpus is None and cfg.trainer.device == "cpu":
        num_cpus = max(os.cpu_count() or 1, plan.placement.bundles)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)


class Terminated(BaseException):
    """SIGTERM (what schedulers send) as an exception: the driver unwinds as on Ctrl-C, so the workers and the
    Ray it started stop cleanly, with no stack dump, and the run ends with exit 143 and one line."""

    step: int | None = None
    """The training step the run was at (None: before the trainer existed); `run` sets it."""


class WorkerDied(RuntimeError):
    """A worker process of the run is gone (SIGKILL, out of memory, a crash): the message names its role, rank and
    node; `logs` holds (its log file, the file's last lines) for each."""

    def __init__(self, message: str, logs: list[tuple[str, list[str]]]):
        super().__init__(message)
        self.logs = logs
        self.step: int | None = None


def worker_died(dead) -> WorkerDied:
    """The `WorkerDied` of the dead workers `dead` (rlx.workers.group.WorkerInfo)."""
    from rlx.workers.group import log_tail

    who = "; ".join(f"{i.role} rank {i.rank} on node {i.node} (pid {i.pid})" for i in dead)
    logs = [log_tail(i) for i in dead]
    where = ", ".join(path for path, _ in logs)
    return WorkerDied(f"a worker died: {who}; its process ended (killed, out of memory or crashed; its log: {where})",
                      logs)


class _Sigterm:
    """The driver's SIGTERM state: unwinding (the handler raises `Terminated` where the driver is) or `deferred`
    (during cleanup: the handler only records it, and `run` raises after the cleanup). One signal is enough: later
    ones are ignored."""

    received = False
    deferred = False

    @classmethod
    def handler(cls, signum, frame):
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cls.received = True
        if not cls.deferred:
            raise Terminated()


def ended_by_sigterm(e: BaseException | None) -> bool:
    """Whether `e` is how a SIGTERM surfaced: `Terminated`, Ray's handler's `SystemExit(SIGTERM)` (while Ray
    starts), or any error after the signal came (the handler's exception raised inside C code comes out as a
    `SystemError`; a cleanup it cut short fails in its own way)."""
    import signal

    if _Sigterm.received:
        return True
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, Terminated) or (isinstance(e, SystemExit) and e.code == signal.SIGTERM):
            return True
        e = e.__cause__ or e.__context__
    return False


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_unwinds():
    """While the command runs, SIGTERM raises `Terminated` in the driver. `ray.init` installs a handler of its own
    (`sys.exit` from wherever the driver is, often inside Ray's C++ calls: an abort and a core dump), so `run` takes
    SIGTERM back right after it (`reclaim_sigterm`)."""
    import signal

    if not _main_thread():
        yield
        return
    _Sigterm.received = _Sigterm.deferred = False
    previous = signal.signal(signal.SIGTERM, _Sigterm.handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def reclaim_sigterm() -> None:
    """Take SIGTERM back from Ray's handler (after `ray.init`), or keep ignoring it once one was received."""
    import signal

    if _main_thread() and signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN):
        signal.signal(signal.SIGTERM, signal.SIG_IGN if _Sigterm.received else _Sigterm.handler)


@contextmanager
def cleanup_uninterrupted():
    """Stopping the workers and Ray is never cut short by SIGTERM: it is recorded, and `run` raises after."""
    _Sigterm.deferred = True
    try:
        yield
    finally:
        _Sigterm.deferred = False


def write_timeline(cfg: RLXConfig) -> None:
    """`ray_init.timeline_json_file`: Ray's task timeline of the run (chrome://tracing JSON), as verl writes it."""
    import ray

    path = cfg.ray_init.timeline_json_file
    if path and ray.is_initialized():
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        ray.timeline(filename=path)
        log.info("ray timeline written to %s", path)


def last_checkpoint_note(cfg: RLXConfig) -> str:
    """What is kept of the run in trainer.default_local_dir, and where the same command starts again under its
    trainer.resume_mode, for the line that ends a stopped run."""
    from rlx.checkpoint.store import list_steps, step_dir

    t = cfg.trainer
    root = os.path.abspath(t.default_local_dir)
    steps = list_steps(root)
    last = step_dir(root, steps[-1]) if steps else None
    if t.resume_mode == "resume_path":
        again = f"the same command resumes from trainer.resume_from_path={t.resume_from_path} again"
        if last is None or os.path.abspath(t.resume_from_path or "") == last:
            return f"{again[0].upper()}{again[1:]}."
        return (f"The last complete checkpoint, {last}, is kept, but {again} (trainer.resume_mode=resume_path). "
                f"To go on from it: trainer.resume_from_path={last}.")
    if last is None:
        return "No checkpoint was saved (trainer.save_freq): the same command starts again from the first step."
    if t.resume_mode == "disable":
        return (f"The last complete checkpoint, {last}, is kept, but the same command starts again from the first "
                f"step (trainer.resume_mode=disable). To resume from it: trainer.resume_mode=auto.")
    return (f"The last complete checkpoint, {last}, is kept: the same command resumes from it "
            f"(trainer.resume_mode=auto).")


def run(cfg: RLXConfig, plan: JobPlan, inputs: DriverInputs | None = None):
    """Check (preflight), lock the checkpoint folder, start Ray (if needed), train the job `plan` describes
    (rlx.plan.make_plan(cfg)); returns the trainer (its `history` holds the per-step metrics). Whatever ends the run,
    the workers and a Ray started here are stopped and the lock is released."""
    from rlx.trainer.preflight import preflight

    inputs = inputs or preflight(cfg, plan)  # before Ray: a job that cannot run stops here
    with run_lock(cfg):  # one run per checkpoint folder; a second stops here, before Ray
        return _run_locked(cfg, plan, inputs)


@contextmanager
def run_lock(cfg: RLXConfig):
    """The lock of `trainer.default_local_dir` (`rlx.checkpoint.lock`) while the run writes there (checkpoints,
    file logs); `CheckpointDirLocked` when another run holds it."""
    from rlx.checkpoint.lock import acquire
    from rlx.config.trainer import local_dir_writers

    if not local_dir_writers(cfg):
        yield None
        return
    lock = acquire(os.path.abspath(cfg.trainer.default_local_dir))
    try:
        yield lock
    finally:
        lock.release()


def _run_locked(cfg: RLXConfig, plan: JobPlan, inputs: DriverInputs):
    import signal
    import time

    import ray

    from rlx.trainer import console
    from rlx.trainer.phases import process_age_s
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    if plan.rollout.note:
        log.warning("rollout: %s", plan.rollout.note)
    log.info("rollout: %s", plan.rollout.engine)
    own_ray = not ray.is_initialized()
    console.drop_known_harmless_warnings()
    trainer: RayPPOTrainer | None = None
    try:
        before_ray = process_age_s()
        start = time.perf_counter()
        try:
            init_ray(cfg, plan)
        except SystemExit as e:  # Ray's own SIGTERM handler, while Ray started
            if e.code != signal.SIGTERM:
                raise
            raise Terminated() from None
        finally:
            reclaim_sigterm()
        ray_init = time.perf_counter() - start
        console.announce_worker_logs()
        if plan.async_ is not None:  # the rollout on GPUs of its own, overlapped with training
            from rlx.trainer.async_trainer import AsyncPPOTrainer

            trainer = AsyncPPOTrainer(cfg, plan, inputs)
            log.info("rollout pool: %d rank(s), staleness bound %d, sync every %d step(s)%s",
                     plan.placement.pools["rollout"].world_size, plan.async_.staleness, plan.async_.sync_every,
                     ", partial rollout" if plan.async_.partial_rollout else "")
        else:
            trainer = RayPPOTrainer(cfg, plan, inputs)
        trainer.launch.add("before_ray", before_ray)
        trainer.launch.add("ray_init", ray_init)
        trainer.history = trainer.fit()
    except (Terminated, KeyboardInterrupt) as e:
        setattr(e, "step", trainer.global_step if trainer is not None else None)  # a KeyboardInterrupt's too
        raise
    except BaseException as e:
        step = trainer.global_step if trainer is not None else None
        if ended_by_sigterm(e):  # SIGTERM surfaced as another error (a SystemError out of C code)
            stopped = Terminated()
            stopped.step = step
            log.debug("SIGTERM surfaced as %s: %s", type(e).__name__, e)
            raise stopped from None
        if isinstance(e, ray.exceptions.RayError):
            from rlx.workers.group import dead_workers

            dead = dead_workers()
            if dead:  # the error is the run noticing: name the worker instead of Ray's traceback
                log.debug("the run stopped on %s: %s", type(e).__name__, e)
                died = worker_died(dead)
                died.step = step
                raise died from None
        raise
    finally:
        with cleanup_uninterrupted():
            write_timeline(cfg)
            if trainer is not None:
                trainer.shutdown()
            if own_ray:
                ray.shutdown()
    assert trainer is not None  # the run finished
    if _Sigterm.received:  # during the cleanup of a run that had finished
        stopped = Terminated()
        stopped.step = trainer.global_step
        raise stopped
    for line in console.validation_summary(trainer.val_history, cfg.trainer.val_before_train or cfg.trainer.val_only):
        print(line, flush=True)
    return trainer
