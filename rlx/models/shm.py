"""verl's `use_shm` (model.use_shm, critic.model.use_shm, data.use_shm): read a model directory or a data file from
a copy in shared memory (`/dev/shm`, a RAM-backed file system) instead of its own disk.

`copy_to_shm(path)` copies a local file or directory once and returns the copy's path; every later call (another
rank on the host, the rollout engine, the next run) finds the finished copy and reuses it. The copy is named after
the source's absolute path and a signature of its files (sizes and modification times), so a source that changed is
copied afresh, never served stale. Ranks of one host racing to copy are serialised by a file lock; the copy is
written under a temporary name and renamed into place when complete, so no reader sees a partial copy.
The copy stays in shared memory (host RAM) after the run, as verl's does; remove `/dev/shm/rlx-shm` to free it.
"""
from __future__ import annotations

import hashlib
import os
import shutil

SHM_ROOT = "/dev/shm"
SUBDIR = "rlx-shm"


def _signature(path: str) -> str:
    """sha256 of the absolute path and each file's relative name, size and mtime (ns)."""
    h = hashlib.sha256(os.path.abspath(path).encode())
    if os.path.isfile(path):
        st = os.stat(path)
        h.update(f"|{st.st_size}|{st.st_mtime_ns}".encode())
        return h.hexdigest()[:16]
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            st = os.stat(full)
            h.update(f"|{os.path.relpath(full, path)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def copy_to_shm(path: str, key: str = "use_shm", root: str = SHM_ROOT) -> str:
    """The path of a copy of the local file or directory `path` under `root` (shared memory), made on first use.

    `key` names the config key in errors (e.g. actor_rollout_ref.model.use_shm)."""
    import fcntl

    src = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(src):
        raise ValueError(f"{key}=True: {path!r} does not exist, so there is nothing to copy to shared memory")
    if not os.path.isdir(root):
        raise ValueError(f"{key}=True: shared memory {root!r} is not available on this host (Linux's /dev/shm); "
                         f"set {key}=False")
    base = os.path.join(root, SUBDIR)
    os.makedirs(base, exist_ok=True)
    slot = os.path.join(base, _signature(src))
    dst = os.path.join(slot, os.path.basename(src.rstrip(os.sep)) or "root")
    if os.path.exists(dst):
        return dst
    with open(slot + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process of the host copies; the others wait and reuse it
        if os.path.exists(dst):
            return dst
        need = _size(src)
        free = shutil.disk_usage(root).free
        if need > free:
            raise ValueError(f"{key}=True: {path!r} takes {need / 2**30:.2f} GiB, but {root} has only "
                             f"{free / 2**30:.2f} GiB free; set {key}=False or free shared memory")
        os.makedirs(slot, exist_ok=True)
        tmp = dst + f".partial-{os.getpid()}"
        if os.path.isdir(src):
            shutil.copytree(src, tmp, dirs_exist_ok=True)
        else:
            shutil.copy2(src, tmp)
        os.rename(tmp, dst)
    return dst


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
