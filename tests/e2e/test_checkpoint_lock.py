"""End-to-end half of tests/unit/test_checkpoint_lock.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import json
import os
import socket
from rlx.checkpoint.lock import LOCK, acquire
from unit.test_checkpoint_lock import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _dead_pid,
    _plant,
)


def test_a_lock_of_a_gone_process_is_reclaimed_with_a_note(tmp_path, caplog):
    dead = _dead_pid()
    _plant(tmp_path, host=socket.gethostname(), pid=dead, proc_start="1")
    with caplog.at_level("WARNING", logger="rlx"):
        lock = acquire(str(tmp_path))
    assert f"reclaimed the lock of {tmp_path}" in caplog.text and f"process {dead} is no longer running" in \
        caplog.text, caplog.text
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()
