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

# (script, arguments, environment): the CPU recipes with `--check`, and the GPU runs' CPU dry runs of docs/testing.md
STAND_IN_RUNS = [(s, ["--check"], {}) for s in SCRIPTS] + [
    ("tests/gpu/gpu_suite.sh", ["list"], {}),
    ("tests/gpu/gpu2_jobs.sh", ["rl"], {"DEVICE": "cpu", "STEPS": "1"}),
]


def _stand_in_tree(tmp_path: Path, script: str, python_rc: int = 0) -> Path:
    """A copy of `script` (at its path in the repository) and scripts/lib/python.sh under tmp_path, next to a
    scripts/setup.sh and a .venv/bin/python that only record their calls in tmp_path/calls.log (the python exits
    with `python_rc`). Returns the log's path."""
    for rel in (script, "scripts/lib/python.sh"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(REPO) / rel, tmp_path / rel)
    log = tmp_path / "calls.log"
    setup = tmp_path / "scripts" / "setup.sh"
    setup.write_text(f"#!/usr/bin/env bash\necho setup >> {log}\n")
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/usr/bin/env bash\necho "venv-python $*" >> {log}\nexit {python_rc}\n')
    for f in (setup, venv_python):
        f.chmod(0o755)
    return log


@pytest.mark.parametrize("script,args,env", STAND_IN_RUNS, ids=[" ".join([s, *a]) for s, a, _ in STAND_IN_RUNS])
def test_script_runs_the_venv_python_without_PYTHON(script, args, env, tmp_path):
    """Without $PYTHON, a script runs scripts/setup.sh and then the .venv's python (here: stand-ins that record their
    calls, in a copy of the repository's layout), never the system python3."""
    log = _stand_in_tree(tmp_path, script)
    env = dict({k: v for k, v in os.environ.items() if k != "PYTHON"}, WORK=str(tmp_path / "work"), **env)
    proc = subprocess.run(["bash", str(tmp_path / script), *args], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    calls = log.read_text().splitlines()
    assert calls[0] == "setup" and calls[1].startswith("venv-python "), calls
    assert all(c == "setup" or c.startswith("venv-python ") for c in calls), calls
    if script in SCRIPTS:
        assert calls[1].startswith("venv-python -m rlx.trainer.main_ppo --config-name quickstart")
        assert calls[1].endswith("--check")


def test_gpu2_jobs_exits_non_zero_when_a_job_fails(tmp_path):
    """`gpu2_jobs.sh rl` prints its table of every job and then exits 1 when any job failed (it used to exit 0)."""
    _stand_in_tree(tmp_path, "tests/gpu/gpu2_jobs.sh", python_rc=3)
    env = dict(os.environ, DEVICE="cpu", STEPS="1", WORK=str(tmp_path / "work"))
    env.pop("PYTHON", None)
    proc = subprocess.run(["bash", str(tmp_path / "tests/gpu/gpu2_jobs.sh"), "rl"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 job(s) failed: a_grpo_fsdp2_2gpu_vllm_tp1 (exit 3) c_ppo_critic_2gpu_vllm_tp1 (exit 3)" in proc.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_passes_check(script):
    """The recipe's own command line, with `--check` appended (scripts pass extra arguments on to main_ppo)."""
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", script, "--check"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "check passed" in proc.stdout, proc.stdout[-2000:]
