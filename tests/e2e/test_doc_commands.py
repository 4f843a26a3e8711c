"""End-to-end half of tests/unit/test_doc_commands.py: each command of the README and docs/ that a CPU can run, in
its cheap form (its rule's `form`), one test per command, named by file:line.

On a checkout with a .venv (after the quick start, as `make test` runs) the commands run exactly as written. Without
one (a developer's checkout running another environment's pytest) `.venv/bin/python` and `.venv/bin/ray` stand for
this test's interpreter, `$PYTHON` is set so that scripts skip scripts/setup.sh, and `make` is told not to run its
setup target."""
from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from unit.test_doc_commands import COMMANDS, Command, rule_of

VENV_PYTHON = Path(REPO) / ".venv" / "bin" / "python"
HAS_VENV = VENV_PYTHON.is_file()
PY = str(VENV_PYTHON) if HAS_VENV else sys.executable
FORMS = {c: getattr(rule_of(c), "form", "no rule") for c in COMMANDS}
RUN = [c for c in COMMANDS if FORMS[c] != "skip"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    if not HAS_VENV:
        env["PYTHON"] = sys.executable
    return env


def _here(text: str) -> str:
    """The command for this checkout: unchanged where it has a .venv."""
    if HAS_VENV:
        return text
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    return text.replace(".venv/bin/python", shlex.quote(sys.executable)).replace(".venv/bin/ray", shlex.quote(ray))


def _make(text: str) -> str:
    return text if HAS_VENV else text.replace("make ", f"make -o setup PY={shlex.quote(sys.executable)} ", 1)


def _no_placeholders(text: str) -> str:
    """The command without the parts the reader fills in (`<your keys>`, `...`)."""
    return " ".join(w for w in re.sub(r"<[^<>]*>", " ", text).split() if w != "...")


def _run(cmd: str, timeout: int = 240, cwd: str = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess, cmd: str) -> None:
    assert proc.returncode == 0, f"`{cmd}` exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"


def _with_flag(text: str, flag: str) -> str:
    """The command with `flag` given to main_ppo: appended, or for `make run` added to its ARGS."""
    m = re.fullmatch(r'make run(?: ARGS="(.*)")?', text)
    if m:
        return _make(f'make run ARGS="{" ".join(filter(None, (m.group(1), flag)))}"')
    return _here(_no_placeholders(text)) + f" {flag}"


def _check(c: Command) -> None:
    cmd = _with_flag(c.text, "--check")
    proc = _run(cmd)
    _ok(proc, cmd)
    assert "check passed" in proc.stdout, proc.stdout[-2000:]


def _collect(c: Command) -> None:
    cmd = _make(c.text + ' PYTEST_ARGS="--collect-only -q -p no:cacheprovider tests/unit/test_layers.py"')
    proc = _run(cmd)
    _ok(proc, cmd)
    assert re.search(r"\d+ tests? collected", proc.stdout), proc.stdout[-2000:]


def _cfg(c: Command) -> None:
    cmd = _with_flag(c.text, "--cfg job")
    proc = _run(cmd)
    _ok(proc, cmd)
    assert "\ntrainer:\n" in proc.stdout, proc.stdout[-2000:]  # the composed config, printed


@functools.lru_cache(maxsize=None)
def _help_text(program: str) -> str:
    cmd = _here(f".venv/bin/python {program} --help")
    proc = _run(cmd)
    _ok(proc, cmd)
    return proc.stdout


def _help(c: Command) -> None:
    program = re.match(r"\.venv/bin/python (-m \S+|\S+\.py)", c.text).group(1)
    text = _help_text(program)
    missing = [f for f in re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", c.text) if f not in text]
    assert not missing, f"{program} --help does not know {missing}:\n{text}"


def _fragment(c: Command) -> None:
    cmd = _here(f".venv/bin/python -m rlx.trainer.main_ppo --config-name quickstart {c.text} --cfg job")
    proc = _run(cmd)
    _ok(proc, cmd)


def _entrypoint(c: Command, tmp_path: Path) -> None:
    """The job's entrypoint as the head node gets it (the submitting shell expands it), run where Ray runs it: in a
    copy of the working dir, which has no .venv/ (it is not uploaded), with no venv on PATH."""
    entry = _no_placeholders(c.text.split(" -- ", 1)[1])
    words = _run(f"printf '%s\\n' {entry}").stdout.splitlines()
    assert os.path.isabs(words[0]) and words[0] == str(VENV_PYTHON), \
        f"the entrypoint's python must be this checkout's venv by an absolute path, not {words[0]!r}"
    if not HAS_VENV:
        words[0] = sys.executable
    proc = _run(shlex.join([*words, "--cfg", "job"]), cwd=str(tmp_path))
    _ok(proc, shlex.join(words))
    assert "\ntrainer:\n" in proc.stdout


@pytest.mark.parametrize("command", RUN, ids=[f"{c.where} {FORMS[c]}" for c in RUN])
def test_doc_command_runs(command, tmp_path):
    form = FORMS[command]
    if form == "no rule":
        pytest.fail(f"{command.text}: no rule of tests/unit/test_doc_commands.py says how to run it")
    elif form == "as_is":
        _ok(_run(_here(command.text)), command.text)
    elif form == "entrypoint":
        _entrypoint(command, tmp_path)
    else:
        {"check": _check, "collect": _collect, "cfg": _cfg, "help": _help, "fragment": _fragment}[form](command)
