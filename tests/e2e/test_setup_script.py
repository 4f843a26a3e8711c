"""scripts/setup.sh says what it installs while it installs: a line before each step (what, roughly how big and how
long), and on a terminal pip's progress as one line written over itself.

The real script runs in a scratch copy of the repository (its own .venv, made by the script), with pip cut off from
every index: the install fails at its first package, after the step line, and the error reaches the user."""
from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture
def scratch(tmp_path):
    """A copy of what setup.sh reads (itself, pyproject.toml) and an environment where pip reaches no package."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(Path(REPO) / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(Path(REPO) / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "no-wheels").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "no-wheels"),
               RLX_VLLM="cpu", PYTHON=sys.executable)
    return tmp_path, env


def test_setup_names_each_install_step_before_it_runs(scratch):
    root, env = scratch
    proc = subprocess.run(["bash", str(root / "scripts" / "setup.sh")], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    assert proc.returncode != 0, proc.stdout
    assert lines[0].startswith(f"[setup] creating {root / '.venv'} (vllm: cpu)"), lines
    step = next((i for i, line in enumerate(lines) if line.startswith("[setup] 1/3 torch 2.13.0, CPU build (~")), None)
    error = next((i for i, line in enumerate(lines) if "torch==2.13.0" in line and "ERROR" in line), None)
    assert step is not None and error is not None and step < error, lines
    assert "MB download" in lines[step] and "minute" in lines[step], lines[step]
    assert not (root / ".venv" / ".rlx-setup-stamp").exists()  # a failed setup is tried again next time
    assert "\r" not in proc.stdout  # a log gets whole lines, no status line


def run_on_a_terminal(cmd: list[str], env: dict, timeout: float) -> tuple[int, bytes]:
    """Run `cmd` with a pseudo-terminal as its stdout and stderr: (exit code, what it wrote)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # every writer closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=30), out


def test_on_a_terminal_pip_shows_its_progress_on_one_status_line(scratch):
    root, env = scratch
    subprocess.run([sys.executable, "-m", "venv", str(root / ".venv")], check=True, timeout=300)
    code, out = run_on_a_terminal(["bash", str(root / "scripts" / "setup.sh")], env, timeout=300)
    text = out.decode(errors="replace")
    assert code != 0, text
    assert f"[setup] updating {root / '.venv'} (vllm: cpu)" in text, text
    assert "[setup] 1/3 torch 2.13.0, CPU build" in text, text
    # pip's own lines (here its "Looking in links"), each drawn over the last: carriage return, erase the line
    assert f"\r\x1b[K[setup]   Looking in links: {root / 'no-wheels'}" in text, text
    assert "torch==2.13.0" in text  # pip's error still reaches the terminal
