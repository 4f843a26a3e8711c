"""End-to-end half of tests/unit/test_recipe_scripts.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import os
import shutil
import subprocess
import sys
from pathlib import Path
import pytest
from conftest import REPO
from unit.test_recipe_scripts import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    SCRIPTS,
)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_runs_the_venv_python_without_PYTHON(script, tmp_path):
    """Without $PYTHON, a script runs scripts/setup.sh and then the .venv's python (here: stand-ins that record their
    calls, in a copy of the scripts folder), never the system python3."""
    (tmp_path / "scripts" / "lib").mkdir(parents=True)
    shutil.copy(Path(REPO) / "scripts" / script, tmp_path / "scripts" / script)
    shutil.copy(Path(REPO) / "scripts" / "lib" / "python.sh", tmp_path / "scripts" / "lib" / "python.sh")
    log = tmp_path / "calls.log"
    setup = tmp_path / "scripts" / "setup.sh"
    setup.write_text(f"#!/usr/bin/env bash\necho setup >> {log}\n")
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/usr/bin/env bash\necho "venv-python $*" >> {log}\n')
    for f in (setup, venv_python):
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / script), "--check"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    calls = log.read_text().splitlines()
    assert calls[0] == "setup" and calls[1].startswith("venv-python -m rlx.trainer.main_ppo --config-name quickstart")
    assert calls[1].endswith("--check")


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_passes_check(script):
    """The recipe's own command line, with `--check` appended (scripts pass extra arguments on to main_ppo)."""
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", f"scripts/{script}", "--check"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "check passed" in proc.stdout, proc.stdout[-2000:]
