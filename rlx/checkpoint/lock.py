"""One run per checkpoint folder: a lock file in `trainer.default_local_dir`.

Two runs writing the same folder overwrite each other's checkpoints, rotate each other's steps away and interleave
their metrics; neither notices. The driver takes the lock before Ray starts (so a second run stops in seconds with
exit 2, naming the holder) and releases it when it ends, whatever ends it.

The lock file (`rlx.lock`) is created with O_EXCL and holds JSON: the holder's host, PID, the process's start time
(from /proc, to tell a reused PID), the wall-clock start and a random token. A lock left by a run that died without
releasing it (SIGKILL, a crash of the node) is reclaimed when its holder is provably gone: same host and the PID
no longer running, or running but started at another time (reused). A holder on another host cannot be checked
from here: the error says how to remove the file by hand once that run is gone.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass

from rlx.checkpoint.errors import CheckpointDirLocked

log = logging.getLogger("rlx")

LOCK = "rlx.lock"
_RECLAIM = LOCK + ".reclaim"  # a short-lived mutex: one process at a time judges and removes a stale lock
_RECLAIM_STALE_S = 60.0


@dataclass
class RunLock:
    """The lock this process holds; `release()` removes the file if it is still ours."""
    path: str
    token: str

    def release(self) -> None:
        holder = _read(self.path)
        if holder is not None and holder.get("token") == self.token:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None where /proc has
    none: with the PID it names one process, even after the PID is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # fields after the command name, which may hold spaces


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            holder = json.load(f)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _describe(holder: dict) -> str:
    return f"host {holder.get('host')!r}, pid {holder.get('pid')}, started {holder.get('started')}"


def _gone(holder: dict) -> str | None:
    """Why the holder's run is provably gone (a note for the log), or None if it may still be running."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return None
    pid = holder["pid"]
    if not _alive(pid):
        return f"its process {pid} is no longer running"
    start = _proc_start(pid)
    if start is not None and holder.get("proc_start") is not None and start != holder["proc_start"]:
        return f"process {pid} is another process now (the PID was reused)"
    return None


def _reclaim(directory: str, path: str, holder: dict) -> bool:
    """Remove the stale lock `holder` if it is still the one at `path`; True when it is gone (by us or another)."""
    mutex = os.path.join(directory, _RECLAIM)
    try:
        fd = os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:  # a reclaimer that died mid-way leaves its mutex: old ones are removed
            if time.time() - os.path.getmtime(mutex) > _RECLAIM_STALE_S:
                os.remove(mutex)
        except OSError:
            pass
        return False
    try:
        os.close(fd)
        current = _read(path)
        if current is not None and current.get("token") == holder.get("token"):
            os.remove(path)
        return True
    finally:
        os.remove(mutex)


def acquire(directory: str, wait_s: float = 2.0) -> RunLock:
    """Take the lock of `directory` (created if missing) for this process, or raise `CheckpointDirLocked` naming
    the holder. A lock whose holder is provably gone is reclaimed with a warning; `wait_s`: how long to look again
    at a lock file that is being written or reclaimed."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK)
    token = uuid.uuid4().hex
    me = {"host": socket.gethostname(), "pid": os.getpid(), "proc_start": _proc_start(os.getpid()),
          "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "token": token}
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            why = _gone(holder) if holder is not None else None
            if why is not None and holder is not None and _reclaim(directory, path, holder):
                log.warning("rlx: note: reclaimed the lock of %s from a run that ended without releasing it "
                            "(%s; %s)", directory, _describe(holder), why)
                continue
            if (holder is None or why is not None) and time.monotonic() < deadline:
                time.sleep(0.1)  # being written, or another process is reclaiming it: look again
                continue
            who = _describe(holder) if holder is not None else "an unreadable lock file"
            raise CheckpointDirLocked(
                f"trainer.default_local_dir={directory!r} is in use by another run ({who}): two runs in one "
                f"checkpoint folder overwrite each other's checkpoints. Fix: wait for that run to end, or give this "
                f"one another trainer.default_local_dir; if that run is gone (e.g. its node died), delete {path}")
        with os.fdopen(fd, "w") as f:
            json.dump(me, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        return RunLock(path, token)
