"""Scoring a step's responses in worker processes, each call bounded by a timeout.

`ScorePool(fn, size, timeout_s)` holds up to `size` worker processes, each a fresh Python interpreter (nothing is
forked from a driver that holds threads, Ray's included, and the driver's main module is not imported again),
talking over a socket pair; they start at the first call and serve every later one. Each worker unpickles the score
function once; `score(calls)` sends one call (its keyword arguments) to each idle worker and collects one `Outcome`
per call, in the calls' order:

- `ok`: the function's result;
- `raised`: the function raised (the exception's type and message, and the user's traceback as text); the worker
  lives on;
- `timeout`: the call ran past `timeout_s`; its worker is killed (not abandoned) and a fresh one takes its place;
- `died`: the worker process ended during the call (e.g. the function called os._exit, or was killed).

Workers ignore SIGINT (Ctrl-C is the driver's to handle) and end when the driver's end of the socket closes: at
`close()`, when the driver exits, or when it dies. The user's function prints to the driver's stdout and stderr.
"""
from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

PROGRESS_EVERY_S = 30.0
"""A step's scoring that takes longer than this reports its progress, and again after each further period."""
READY_TIMEOUT_S = 120.0
"""How long a new worker may take to start and load the function before calls are sent to it anyway."""


@dataclass
class Outcome:
    kind: Literal["ok", "raised", "timeout", "died"]
    """What became of the call (see the module doc)."""
    value: Any = None
    """The function's result (ok)."""
    error: str = ""
    """`Type: message` of the exception (raised), or what ended the worker (died)."""
    traceback: str = ""
    """The user's traceback, as text (raised)."""


def call_in_process(fn: Callable, kwargs: dict) -> Outcome:
    """One call in this process, its exception caught as a pool worker catches it."""
    try:
        return Outcome("ok", fn(**kwargs))
    except Exception as e:  # noqa: BLE001 - the user's function: any failure is reported with its sample
        return Outcome("raised", error=f"{type(e).__name__}: {e}", traceback=_user_traceback(e))


_OWN_FILES = (__file__.replace("pool.py", "functions.py"), __file__)


def _user_traceback(e: BaseException) -> str:
    """The traceback from the user's function down (without the frames of rlx.reward calling it)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def serve() -> None:
    """A worker's main (`python -c ... <fd>`): the pickled function first, then calls in and outcomes out, until None
    or the end of the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = multiprocessing.connection.Connection(int(sys.argv[1]))
    try:
        fn = pickle.loads(conn.recv_bytes())
    except Exception as e:  # noqa: BLE001 - the function's file fails to load here (it loaded in the driver)
        fn, load_error = None, Outcome("raised", error=f"loading the function in the scoring process failed "
                                                       f"({type(e).__name__}: {e})", traceback=_user_traceback(e))
    conn.send_bytes(b"ready")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, kwargs = msg
        outcome = call_in_process(fn, kwargs) if fn is not None else load_error
        try:
            conn.send((index, outcome))
        except Exception as e:  # noqa: BLE001 - a result that does not pickle
            conn.send((index, Outcome("raised", error=f"its result {type(outcome.value).__name__} cannot be sent "
                                                      f"back from the scoring process ({type(e).__name__}: {e})")))


class _Worker:
    def __init__(self, fn_bytes: bytes):
        mine, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # rlx and the user's imports
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from rlx.reward.pool import serve; serve()", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        self.conn = multiprocessing.connection.Connection(mine.detach())
        self.conn.send_bytes(fn_bytes)
        self.index: Optional[int] = None  # the call it is scoring
        self.started = 0.0

    def wait_ready(self) -> None:
        """Until the worker has loaded the function (its start does not count against a call's timeout)."""
        try:
            if self.conn.poll(READY_TIMEOUT_S):
                self.conn.recv_bytes()
        except (EOFError, OSError):  # it ended at once: its first call reports that
            pass

    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_code(self) -> Optional[int]:
        try:
            return self.process.wait(5)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait()
        self.conn.close()


class ScorePool:
    """Worker processes that call one score function (see the module doc). `fn` must pickle (rlx's loaded functions
    do: rlx.reward.functions.FileFunction); `ensure_picklable(fn)` says why one does not."""

    def __init__(self, fn: Callable, size: int, timeout_s: Optional[float]):
        assert size >= 1, size
        self.fn_bytes = pickle.dumps(fn)
        self.size, self.timeout_s = size, timeout_s
        self.workers: list[_Worker] = []

    def _start(self, n: int) -> None:
        fresh = [_Worker(self.fn_bytes) for _ in range(min(n, self.size) - len(self.workers))]
        for w in fresh:  # they start side by side
            w.wait_ready()
        self.workers += fresh

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = self.workers[self.workers.index(worker)] = _Worker(self.fn_bytes)
        fresh.wait_ready()
        return fresh

    def score(self, calls: list[dict], progress: Optional[Callable[[int, float], None]] = None) -> list[Outcome]:
        """One outcome per call. `progress(done, elapsed_s)` is called when the calls have run PROGRESS_EVERY_S
        seconds, and after each further period."""
        self._start(len(calls))
        outcomes: list[Optional[Outcome]] = [None] * len(calls)
        pending = deque(range(len(calls)))
        start = time.monotonic()
        next_report, done = start + PROGRESS_EVERY_S, 0
        while done < len(calls):
            for w in list(self.workers):
                if w.index is None and pending:
                    if not w.alive():  # ended after its last result
                        w = self._replace(w)
                    index = pending.popleft()
                    try:
                        w.conn.send((index, calls[index]))
                    except Exception as e:  # noqa: BLE001 - a sample whose data does not pickle
                        outcomes[index] = Outcome("raised", error=f"the sample cannot be sent to the scoring "
                                                                  f"process ({type(e).__name__}: {e})")
                        done += 1
                        continue
                    w.index, w.started = index, time.monotonic()
            busy = [w for w in self.workers if w.index is not None]
            now = time.monotonic()
            deadline = next_report
            if self.timeout_s is not None:
                deadline = min([deadline] + [w.started + self.timeout_s for w in busy])
            ready = multiprocessing.connection.wait([w.conn for w in busy], timeout=max(0.0, deadline - now))
            now = time.monotonic()
            for w in busy:
                assert w.index is not None  # a busy worker
                outcome, index = None, w.index
                if w.conn in ready:
                    try:
                        got, outcome = w.conn.recv()
                        assert got == index, (got, index)
                    except (EOFError, OSError):  # the process ended: its end of the socket closed
                        outcome = Outcome("died", error=f"ended its scoring process (exit code {w.exit_code()}) "
                                                        f"during the call")
                        self._replace(w)
                elif self.timeout_s is not None and now - w.started >= self.timeout_s:
                    outcome = Outcome("timeout")
                    self._replace(w)  # killed, not abandoned: a hung call holds no process after its timeout
                if outcome is not None:
                    outcomes[index] = outcome
                    done += 1
                    w.index = None
            if progress is not None and now >= next_report and done < len(calls):
                progress(done, now - start)
                next_report = now + PROGRESS_EVERY_S
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self.workers:
            try:
                w.process.wait(2)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self.workers = []


def ensure_picklable(fn: Callable) -> Optional[str]:
    """None when `fn` pickles (it can be scored in a pool), else why not."""
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - pickle raises several types (PicklingError, AttributeError, TypeError)
        return f"{type(e).__name__}: {e}"
    return None
