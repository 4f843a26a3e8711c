"""Writes that fail as a full, read-only or broken disk fails them: `fail_writes(path, "ENOSPC")` makes every later
open for writing of a file whose path starts with `path` (a folder: every file under it) raise that OSError in this
process (`fail_writes(None)` undoes it). Python's `open` is where every checkpoint file of rlx is created
(torch.distributed.checkpoint's shards, the `atomic_write` of the rest), so the save under test runs unchanged above
it.

A subprocess run (the command and its Ray workers) gets it with this folder first on `PYTHONPATH` and
`RLX_TEST_WRITE_FAULT=<errno name>:<path>` in its environment: Python imports `sitecustomize` at every start."""
from __future__ import annotations

import builtins
import errno
import io
import os


def fail_writes(path: str | None, name: str = "ENOSPC") -> None:
    real = getattr(io.open, "real_open", io.open)  # this module may come by value (Ray's pickle): no state of its own
    if path is None:
        builtins.open = io.open = real
        return
    code, path = getattr(errno, name), os.path.abspath(path)

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+"):
            target = os.path.abspath(os.fsdecode(file))
            if target.startswith(path):
                raise OSError(code, os.strerror(code), target)
        return real(file, mode, *args, **kwargs)

    open_.real_open = real
    builtins.open = io.open = open_


if os.environ.get("RLX_TEST_WRITE_FAULT"):
    _name, _, _path = os.environ["RLX_TEST_WRITE_FAULT"].partition(":")
    fail_writes(_path, _name)
