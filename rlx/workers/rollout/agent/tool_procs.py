"""Synchronous function tools run in worker processes of their own, so that a tool that misbehaves cannot hurt the
rollout that calls it:

* a call past its timeout is killed with its process (and every process it started: each worker leads a session
  of its own), never left running; the next call gets a fresh process;
* what a call prints (its file descriptors 1 and 2, so `print`, C extensions and subprocesses alike) goes into a pipe
  that the worker drains: the first `OUTPUT_LIMIT` bytes are kept and handed back with the result, the rest is
  counted and dropped, so a tool printing forever neither fills the disk nor blocks;
* a tool that ends its process (`os._exit`, a segfault, the OOM killer) is reported as `ToolProcessDied` naming how
  it ended; the worker is replaced.

Workers are reused (one call at a time each, up to `MAX_PROCESSES` at once), so a fast tool costs a round trip over
a pipe, not a process start. A worker is `python -m rlx.workers.rollout.agent.tool_procs <in fd> <out fd>` with the
caller's `sys.path`; it finds the function by module and name, or by the file it was loaded from
(`multi_turn.function_tool_path`). It exits when the process that started it is gone.
"""
from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Optional

MAX_PROCESSES = 32
"""Tool calls run at once per rollout process (the rest wait for a worker; the wait counts toward the timeout)."""
OUTPUT_LIMIT = 4096
"""Bytes of a call's stdout and stderr kept (the first ones); the rest is dropped and counted."""

FnRef = tuple  # ("module", module name, qualname) | ("file", path, qualname)


class ToolTimeout(Exception):
    """The call did not answer in time; its process was killed."""


class ToolProcessDied(Exception):
    """The tool ended its worker process (the message says how)."""


def function_ref(fn, path: Optional[str] = None) -> FnRef:
    """How a worker process finds `fn`: by the file `path` it was loaded from, else by its module's name."""
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<" in qualname:
        raise ValueError(f"function tool {getattr(fn, '__name__', fn)!r} is not defined at the top level of a "
                         f"module (qualname {qualname!r}); sync tools run in worker processes that import it by "
                         f"name. Fix: define it at the top level of the function_tool_path file")
    module = getattr(fn, "__module__", None) or "__main__"
    if path is not None and module.startswith("rlx_function_tools_"):
        return ("file", os.path.abspath(path), qualname)
    if module == "__main__" or module.startswith("rlx_function_tools_"):
        import inspect

        source = inspect.getsourcefile(fn)
        if source is None:
            raise ValueError(f"function tool {qualname!r} has no source file; sync tools run in worker processes "
                             f"that import it from its file. Fix: define it in the function_tool_path file")
        return ("file", os.path.abspath(source), qualname)
    return ("module", module, qualname)


class _Worker:
    def __init__(self):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(to_child_r), str(from_child_w)], pass_fds=(to_child_r,
                                                                                               from_child_w),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, env=env)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.recv_conn = Connection(from_child_r, writable=False)

    def kill(self) -> Optional[int]:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the tool's own subprocesses too
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait()
        self.send_conn.close()
        self.recv_conn.close()
        return code

    def ended(self) -> str:
        """How the process ended (after the pipe closed)."""
        code: Optional[int]
        try:
            code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            code = self.kill()
        self.send_conn.close()
        self.recv_conn.close()
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"


class ToolProcessPool:
    """Worker processes for sync function tools, reused across calls; `call` blocks a thread at most `timeout_s`."""

    def __init__(self, max_processes: int = MAX_PROCESSES):
        self.max_processes = max_processes
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self.callers = ThreadPoolExecutor(max_workers=max_processes, thread_name_prefix="rlx-tool")
        """Threads that wait on the workers' pipes (never on a tool: each returns by its deadline)."""
        atexit.register(self.close)

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
                self._all.discard(worker)
        worker = _Worker()
        with self._lock:
            self._all.add(worker)
        return worker

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)

    def call(self, ref: FnRef, kwargs: dict, deadline: float) -> tuple[Any, str]:
        """(the function's return value, its captured output); raises what the tool raised (as `ToolError`),
        `ToolTimeout` past `deadline` (time.monotonic), `ToolProcessDied`."""
        if time.monotonic() >= deadline:
            raise ToolTimeout("waited for a free tool worker until the timeout")
        worker = self._take()
        try:
            worker.send_conn.send((ref, kwargs))
            ready = worker.recv_conn.poll(max(0.0, deadline - time.monotonic()))
        except (OSError, EOFError):
            ready = True  # the worker is gone: recv below says how
        if not ready:
            self._drop(worker)
            worker.kill()
            raise ToolTimeout("its process was killed")
        try:
            kind, value, output = worker.recv_conn.recv()
        except (OSError, EOFError):
            self._drop(worker)
            raise ToolProcessDied(worker.ended()) from None
        with self._lock:
            self._idle.append(worker)
        if kind == "error":
            raise ToolError(value, output)
        return value, output

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = list(self._all), set(), []
        for worker in workers:
            worker.kill()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._all]


class ToolError(Exception):
    """The tool raised: `args[0]` is "Type: message", `output` what it printed."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


_POOL: Optional[ToolProcessPool] = None
_POOL_LOCK = threading.Lock()


def pool() -> ToolProcessPool:
    """This process's pool (started at the first sync tool call)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ToolProcessPool()
        return _POOL


# ---- the worker process ----------------------------------------------------------------------------------------
class _Capture:
    """Fds 1 and 2 into a fresh pipe for one call; a thread keeps the first `limit` bytes and counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.head, self.total = limit, bytearray(), 0
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)
        self._r = r
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._r, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self.total += len(chunk)
            if len(self.head) < self.limit:
                self.head += chunk[:self.limit - len(self.head)]

    def finish(self, devnull: int) -> str:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(devnull, 1)  # the pipe's last writer goes (unless the tool left a process holding it)
        os.dup2(devnull, 2)
        self._thread.join(timeout=1.0)
        if self._thread.is_alive():  # a leftover writer: leave the pipe to the thread
            return self._text(" (still written to by a process the tool left)")
        os.close(self._r)
        return self._text("")

    def _text(self, note: str) -> str:
        text = self.head.decode("utf-8", errors="replace")
        if self.total > len(self.head):
            text += f"\n... ({self.total - len(self.head)} more bytes dropped{note})"
        return text


def _resolve(ref: FnRef, modules: dict):
    kind, where, qualname = ref
    if where not in modules:
        if kind == "module":
            modules[where] = importlib.import_module(where)
        else:
            spec = importlib.util.spec_from_file_location(f"rlx_function_tools_{abs(hash(where))}", where)
            assert spec is not None and spec.loader is not None  # a .py file the driver loaded tools from
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            modules[where] = module
    obj = modules[where]
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def _main(in_fd: int, out_fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C stops the run, which kills this process
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    recv, send = Connection(in_fd, writable=False), Connection(out_fd, readable=False)
    devnull = os.open(os.devnull, os.O_WRONLY)
    modules: dict = {}
    while True:
        try:
            ref, kwargs = recv.recv()
        except (EOFError, OSError):
            os._exit(0)
        capture = _Capture(OUTPUT_LIMIT)
        try:
            reply = ("ok", _resolve(ref, modules)(**kwargs), "")  # the third: the output, added below
        except BaseException as e:  # noqa: BLE001 - SystemExit included: the caller gets it as the tool's error
            reply = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
        output = capture.finish(devnull)
        if reply[0] == "error":
            reply = ("error", reply[1], (output + "\n" if output else "") + reply[2])
        else:
            reply = (reply[0], reply[1], output)
        try:
            send.send(reply)
        except Exception as e:  # noqa: BLE001 - a return value that cannot be pickled
            send.send(("error", f"the tool's return value cannot be sent back ({type(e).__name__}: {e}); return a "
                                f"str, dict, list or ToolResponse", output))


if __name__ == "__main__":
    _main(int(sys.argv[1]), int(sys.argv[2]))
