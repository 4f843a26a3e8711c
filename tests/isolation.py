"""Each GPU or end-to-end test leaves the pytest process, and the GPUs, as it found them (autouse fixtures, imported
by tests/conftest.py).

Checked after every end-to-end test (tests/e2e, or marked `gpu` or `slow`), or using the session's Ray (fixture
`ray_local`):
* os.environ is unchanged: a variable that rlx or a test set or removed is put back, and the test fails naming it.
  Variables a library sets for itself (Ray's RAY_CLIENT_MODE on import, vLLM's on import, torch's inductor cache
  folder) are left alone: every write to os.environ is attributed to the file that made it;
* no default torch.distributed process group and no Ray was left started by the test (a leftover one is shut down).
  The session's shared Ray (`ray_local`) may stay up, but the test's actors and placement groups must be gone from
  it (its CPUs and GPUs taken as before the test);
* tests marked gpu only: this process's CUDA memory, allocated and reserved, is what it was before the test (after
  gc.collect and emptying the caching allocator, which also hands back what the test's tensors had reserved, so
  the process never sits on cached GPU memory that a later test's vLLM or subprocess needs), and the memory in
  use on each GPU, by any process, is back within GPU_SLACK of its level before the test (a Ray worker, a vLLM
  engine or a subprocess left holding a GPU). With RLX_CUDA_LEAK_TRACE=1 a leak's message also lists the blocks the
  test allocated and left, each with the Python frames that allocated it (`leak_trace_start`; costs time, so off).
After each module holding such tests, once its module-scoped fixtures are torn down (they may keep a process group
or set variables for all of its tests): the same environment, process-group and Ray checks against its start.

A failed check is an error at the test's teardown ("ERROR at teardown of <test>") saying what was left and how much.
"""
from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_SLACK = 1 << 20
"""Bytes of this process's CUDA memory a test may leave allocated or reserved (lazily created library state)."""
GPU_SLACK = 1 << 30
"""Bytes by which a GPU's memory in use may stay above its level before a test: this process's cuBLAS and NCCL state
and loaded kernels grow it. A leftover process holds at least its CUDA context (~0.5 GiB) plus its tensors; an
engine or a model left behind holds far more."""
CONTEXT_SLACK = 2 << 30
"""More slack in the test that created this process's CUDA context (which stays for the session)."""
GPU_SETTLE_S = 60.0
"""How long a GPU's memory may take to come back (killed Ray workers exit asynchronously)."""
CUDA_SETTLE_S = 5.0
"""How long this process's CUDA memory may take to come back (NCCL's watchdog thread lets go of the tensors of the
last collectives on its own time)."""
RAY_SETTLE_S = 30.0
"""How long the shared Ray's resources may take to come back (actor kills and placement-group removal are
asynchronous)."""
IGNORED_ENV = ("PYTEST_CURRENT_TEST",)
"""Variables pytest itself changes between a test's phases."""


# ---- os.environ, with who wrote each variable ------------------------------------------------------------------
WRITERS: dict[str, str] = {}
"""Variable -> the file whose code last set or removed it in os.environ (since tests/conftest.py was imported)."""
ROOTS = {REPO}
"""Where this repository's code lives (and the rootdir of the pytest run): writes from files under these count."""
_PASS_THROUGH = ("os", "_collections_abc", "collections.abc", __name__)  # os.environ.setdefault/update/pop/clear


def _writer() -> str:
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in _PASS_THROUGH:
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else "?"


def track_env_writers() -> None:
    """Record, for every write to os.environ from now on, the file that made it (in WRITERS)."""
    cls = type(os.environ)
    if getattr(cls, "_rlx_tracked", False):
        return
    set_item, del_item = cls.__setitem__, cls.__delitem__

    def __setitem__(self, key, value):
        set_item(self, key, value)
        if self is os.environ:
            WRITERS[key] = _writer()

    def __delitem__(self, key):
        del_item(self, key)
        if self is os.environ:
            WRITERS[key] = _writer()

    cls.__setitem__, cls.__delitem__, cls._rlx_tracked = __setitem__, __delitem__, True


def by_this_repo(key: str) -> bool:
    """The variable's last write came from this repository's code (rlx, the tests, the scripts), or from nowhere
    recorded; not from a library configuring itself."""
    path = WRITERS.get(key)
    if path is None:
        return True
    path = os.path.abspath(path)
    return any(path.startswith(root + os.sep) for root in ROOTS) and "site-packages" not in path


def _short(path: str) -> str:
    path = os.path.abspath(path)
    root = next((r for r in ROOTS if path.startswith(r + os.sep)), None)
    return os.path.relpath(path, root) if root else path


def restore_env(before: dict[str, str]) -> list[str]:
    """Put the variables that this repository's code changed back as in `before`; returns them ('+KEY' added,
    '-KEY' removed, '~KEY' changed, each with the file that did it)."""
    now = dict(os.environ)
    changed = sorted(k for k in before.keys() | now.keys()
                     if before.get(k) != now.get(k) and k not in IGNORED_ENV and by_this_repo(k))
    out = []
    for k in changed:
        sign = "+" if k not in before else "-" if k not in now else "~"
        out.append(f"{sign}{k} (by {_short(WRITERS[k]) if k in WRITERS else 'unknown code'})")
        if k in before:
            os.environ[k] = before[k]
        else:
            del os.environ[k]
    return out


# ---- torch.distributed and Ray ---------------------------------------------------------------------------------
def process_group_up() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def destroy_process_group() -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group is still dropped from the registry
        pass


def ray_up() -> bool:
    ray = sys.modules.get("ray")  # never imported here: the GPU engine tests run without Ray
    # asked of ray._private.worker, which `ray.is_initialized` re-exports: a test's monkeypatch of it is not seen (the
    # monkeypatch fixture may still be in place when this runs)
    return ray is not None and ray._private.worker.is_initialized()


def ray_taken() -> dict[str, float]:
    """CPUs and GPUs of the running Ray taken now (by actors or placement groups)."""
    from ray._private import state  # what ray.cluster_resources re-exports: a test's monkeypatch of it is not seen

    total, free = state.cluster_resources(), state.available_resources()
    return {k: total.get(k, 0.0) - free.get(k, 0.0) for k in ("CPU", "GPU")}


def ray_growth(before: dict[str, float], settle_s: float = RAY_SETTLE_S) -> dict[str, float]:
    """{CPU/GPU: how much more is taken than `before`}, after up to `settle_s` seconds."""
    deadline = time.monotonic() + settle_s
    while True:
        over = {k: v - before.get(k, 0.0) for k, v in ray_taken().items() if v - before.get(k, 0.0) > 1e-6}
        if not over or time.monotonic() > deadline:
            return over
        time.sleep(0.5)


# ---- CUDA ----------------------------------------------------------------------------------------------------
def cuda_in_use() -> bool:
    """This process has initialised CUDA (asking never initialises it: a test may still fork)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()


def cuda_held() -> list[tuple[int, int]]:
    """(allocated, reserved) bytes of this process's caching allocator per device, after freeing what can be."""
    import torch

    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:  # cuBLAS keeps a workspace per handle and stream in the allocator until cleared
        clear()
    torch.cuda.empty_cache()
    return [(torch.cuda.memory_allocated(d), torch.cuda.memory_reserved(d)) for d in range(torch.cuda.device_count())]


def cuda_growth(before: list[tuple[int, int]] | None, settle_s: float = CUDA_SETTLE_S) -> dict[int, tuple[int, int]]:
    """{device: (allocated, reserved) bytes above `before` + CUDA_SLACK}, after up to `settle_s` seconds."""
    deadline = time.monotonic() + settle_s
    while True:
        now = cuda_held()
        base = before or [(0, 0)] * len(now)
        over = {d: (a1 - a0, r1 - r0) for d, ((a0, r0), (a1, r1)) in enumerate(zip(base, now))
                if a1 - a0 > CUDA_SLACK or r1 - r0 > CUDA_SLACK}
        if not over or time.monotonic() > deadline:
            return over
        time.sleep(0.5)


def gpu_used() -> list[int] | None:
    """Bytes in use on each GPU, by every process (nvidia-smi: no CUDA context needed here); None without it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        return [int(float(x)) << 20 for x in out.split()]
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


def gpu_growth(before: list[int], slack: int, settle_s: float = GPU_SETTLE_S) -> dict[int, int]:
    """{GPU: bytes in use above `before`, where more than `slack`}, after up to `settle_s` seconds."""
    deadline = time.monotonic() + settle_s
    while True:
        now = gpu_used()
        if now is None or len(now) != len(before):
            return {}
        over = {i: n - b for i, (b, n) in enumerate(zip(before, now)) if n - b > slack}
        if not over or time.monotonic() > deadline:
            return over
        time.sleep(1.0)


def _live_blocks() -> dict[int, dict]:
    """The caching allocator's live blocks by address (torch.cuda.memory._snapshot), each with its frames when
    allocation history is recorded (RLX_CUDA_LEAK_TRACE=1)."""
    import torch

    return {b["address"]: b for seg in torch.cuda.memory._snapshot()["segments"] for b in seg["blocks"]
            if b["state"] == "active_allocated"}


def _where(block: dict, depth: int = 6) -> str:
    """The Python frames that allocated `block`, innermost first (rlx's and the tests' files only, when any)."""
    frames = [f for f in block.get("frames", []) if f.get("filename", "").endswith(".py")]
    ours = [f for f in frames if "/rlx/" in f["filename"] or "/tests/" in f["filename"]] or frames
    return " <- ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in ours[:depth]) or "?"


def leak_trace_start():
    """With RLX_CUDA_LEAK_TRACE=1 (a GPU run): record each CUDA allocation's stack from here on, and the blocks
    already live; `leak_trace_lines` then names what a test allocated and left. Off (None) by default: the
    recording costs time on every allocation."""
    if os.environ.get("RLX_CUDA_LEAK_TRACE") != "1" or not cuda_in_use():
        return None
    import torch

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    return set(_live_blocks())


def leak_trace_lines(before, most: int = 8) -> list[str]:
    """The largest blocks allocated since `leak_trace_start` and still live, with the frames that allocated them."""
    if before is None:
        return []
    gc.collect()
    left = sorted((b for a, b in _live_blocks().items() if a not in before), key=lambda b: -b["size"])
    return [f"  {_mib(b['size'])} ({b['size']} B) allocated at {_where(b)}" for b in left[:most]]


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


# ---- the checks --------------------------------------------------------------------------------------------------
class Snapshot:
    """What a test (or a module) found when it started."""

    def __init__(self, gpu: bool):
        self.env = dict(os.environ)
        self.pg = process_group_up()
        self.ray = ray_up()
        self.ray_taken = ray_taken() if self.ray else {}
        self.gpu = gpu
        self.cuda = cuda_in_use()
        self.held = cuda_held() if gpu and self.cuda else None
        self.trace = leak_trace_start() if gpu else None
        self.used = gpu_used() if gpu else None

    def leftovers(self, what: str, shared_ray: bool) -> list[str]:
        """Undo what can be undone; one line per thing that `what` (a test, a module) left behind."""
        problems = []
        env = restore_env(self.env)
        if env:
            problems.append(f"{what} changed os.environ (restored): {', '.join(env)}")
        if process_group_up() and not self.pg:
            destroy_process_group()
            problems.append(f"{what} left the default torch.distributed process group initialised (destroyed)")
        if ray_up():
            if not self.ray and not shared_ray:
                sys.modules["ray"].shutdown()
                problems.append(f"{what} left Ray initialised (shut down); tests share the session's (ray_local)")
            else:
                busy = ray_growth(self.ray_taken)
                if busy:
                    problems.append(f"{what} left actors or placement groups in the shared Ray, holding {busy} more "
                                    f"than before ({RAY_SETTLE_S:.0f} s later): trainer.shutdown(), ray.kill(actor)")
        if self.gpu and cuda_in_use():
            for d, (alloc, reserved) in cuda_growth(self.held).items():
                problems.append(f"{what} left {_mib(alloc)} more CUDA memory allocated ({_mib(reserved)} more "
                                f"reserved) on cuda:{d} in this process: a tensor outlives it (a global, a cache, a "
                                f"module-level object, a reference cycle gc cannot free)")
                problems.extend(leak_trace_lines(self.trace))  # with RLX_CUDA_LEAK_TRACE=1: what and where
        if self.gpu and self.used is not None:
            slack = GPU_SLACK + (CONTEXT_SLACK if cuda_in_use() and not self.cuda else 0)
            for d, extra in gpu_growth(self.used, slack).items():
                problems.append(f"GPU {d}: {_mib(extra)} more in use than before {what}, {GPU_SETTLE_S:.0f} s after "
                                f"it (allowed {_mib(slack)}): a process it started still holds the GPU (a Ray worker, "
                                f"a vLLM engine, a subprocess)")
        return problems


def checked(item) -> bool:
    """Whether the checks apply to a test: an end-to-end one (tests/e2e, marked e2e at collection; or marked gpu or
    slow), or one using the session's Ray."""
    return any(item.get_closest_marker(m) for m in ("e2e", "gpu", "slow")) or "ray_local" in item.fixturenames


def _shared_ray(session) -> bool:
    """The running Ray is the session's shared one (conftest `ray_local` started or adopted it)."""
    return bool(getattr(session, "rlx_shared_ray", False))


def _fail(problems: list[str]) -> None:
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def each_module_isolated(request):
    """Once the module's own fixtures are torn down: its environment, process group and Ray as at its start."""
    ROOTS.add(str(request.config.rootpath))
    mine = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    if not any(checked(item) for item in mine):
        yield
        return
    start = Snapshot(gpu=False)
    yield
    _fail(start.leftovers(f"module {request.module.__name__}", _shared_ray(request.session)))


@pytest.fixture(autouse=True)
def each_test_isolated(request):
    """After the test (its own fixtures torn down first): nothing of it left behind."""
    if not checked(request.node):
        yield
        return
    start = Snapshot(gpu=request.node.get_closest_marker("gpu") is not None)
    yield
    _fail(start.leftovers(f"test {request.node.name}", _shared_ray(request.session)))
