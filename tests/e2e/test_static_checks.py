"""The static checks of the test command: mypy over rlx/ (untyped bodies checked) and ruff's pyflakes rules over
rlx/, scripts/, benchmarks/ and tests/, both with the settings of pyproject.toml. Any finding fails the run with the tools'
own output. Both tools come with the `test` extra (`make test` installs it)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    probe = subprocess.run([sys.executable, "-m", tool, "--version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"{tool} is not installed in {sys.executable}: it comes with the test extra. Fix: make setup, "
                    f"or pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900)


def test_mypy_finds_nothing():
    """`mypy` with pyproject.toml's [tool.mypy] (rlx/, check_untyped_defs; its cache in the repo's ignored
    .mypy_cache, so a second run takes seconds)."""
    out = _run("mypy")
    if out.returncode != 0:
        pytest.fail(f"mypy found errors (settings: pyproject.toml [tool.mypy]):\n{out.stdout}{out.stderr}", False)


def test_ruff_pyflakes_finds_nothing():
    """`ruff check` with pyproject.toml's [tool.ruff] (F: undefined names, unused imports and variables)."""
    out = _run("ruff", "check", "--output-format", "concise", "rlx", "scripts", "benchmarks", "tests")
    if out.returncode != 0:
        pytest.fail(f"ruff found problems (settings: pyproject.toml [tool.ruff]):\n{out.stdout}{out.stderr}", False)
