"""One run per checkpoint folder: the lock file in trainer.default_local_dir."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from rlx.checkpoint.lock import LOCK, CheckpointDirLocked, _proc_start, acquire


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plant(directory, **holder) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, LOCK), "w") as f:
        json.dump({"started": "2026-01-01 00:00:00 +0000", "token": "theirs", **holder}, f)


def test_second_taker_is_refused_naming_the_holder_until_release(tmp_path):
    root = str(tmp_path / "ckpts")
    lock = acquire(root)
    holder = json.loads((tmp_path / "ckpts" / LOCK).read_text())
    assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid() and holder["started"]
    with pytest.raises(CheckpointDirLocked) as e:
        acquire(root)
    msg = str(e.value)
    assert f"trainer.default_local_dir={root!r} is in use by another run" in msg, msg
    assert f"pid {os.getpid()}" in msg and socket.gethostname() in msg and "Fix:" in msg, msg
    lock.release()
    assert not (tmp_path / "ckpts" / LOCK).exists()
    with acquire(root):
        assert (tmp_path / "ckpts" / LOCK).exists()
    assert not (tmp_path / "ckpts" / LOCK).exists()


def test_a_reused_pid_is_not_the_holder(tmp_path, caplog):
    """Same host, the PID alive but started at another time (reused): the holder is gone."""
    if _proc_start(os.getpid()) is None:
        pytest.skip("no /proc to read a start time from")
    _plant(tmp_path, host=socket.gethostname(), pid=os.getpid(), proc_start="1")
    with caplog.at_level("WARNING", logger="rlx"):
        acquire(str(tmp_path)).release()
    assert "the PID was reused" in caplog.text


@pytest.mark.parametrize("holder", [{"host": "another-node", "pid": 1}, None])
def test_a_holder_that_cannot_be_checked_is_refused(tmp_path, holder):
    """Another host's run (its PID means nothing here), or a lock file that does not read: never taken over."""
    if holder is None:
        (tmp_path / LOCK).write_text("{half a lock")
    else:
        _plant(tmp_path, **holder)
    with pytest.raises(CheckpointDirLocked, match=f"delete {tmp_path / LOCK}"):
        acquire(str(tmp_path), wait_s=0.2)
    assert (tmp_path / LOCK).exists()


def _no_ray(monkeypatch):
    """Ray must not start: a spy (an earlier test of the session may have started the shared local Ray)."""
    from rlx.trainer import launch

    def init_ray(*args):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(launch, "init_ray", init_ray)


def test_main_exits_2_before_ray_while_another_run_holds_the_folder(tmp_path, capsys, monkeypatch):
    from rlx.trainer.cli import main

    _no_ray(monkeypatch)
    root = tmp_path / "ckpts"
    with acquire(str(root)):  # a live holder (this process, standing in for another run)
        code = main(["--config-name", "quickstart", f"trainer.default_local_dir={root}", "trainer.save_freq=1",
                     "trainer.logger=[console]"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "is in use by another run" in err and f"pid {os.getpid()}" in err, err
