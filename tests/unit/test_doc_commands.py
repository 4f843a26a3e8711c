"""The commands of README.md and docs/*.md work as written, on a fresh clone after the quick start, with no venv
activated. This half reads them (nothing runs): every command of a ```bash block is classified by `RULES` (run in a
cheap form by tests/e2e/test_doc_commands.py, or not run, with the reason), names the venv's interpreter rather
than a bare `python` / `ray`, and names files that exist. A command added to the docs without a rule fails here,
naming it; so does a rule that no command matches any more.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

ROOT = Path(REPO)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Command:
    text: str
    """The command, continuation lines joined, its comment dropped."""
    where: str
    """file:line of its first line (of its first occurrence, when several docs show it)."""


@dataclass(frozen=True)
class Rule:
    pattern: str
    """re.search on the command's text; the first rule that matches classifies the command."""
    form: str
    """How tests/e2e/test_doc_commands.py runs it: `as_is`; `check` (main_ppo's --check: `make run ARGS=--check`);
    `cfg` (--cfg job appended, for `make run` in ARGS: composition and key names, no GPU needed); `help` (--help,
    which must name every --flag of the command); `fragment` (key=value lines composed on the quickstart config with --cfg job);
    `entrypoint` (a `ray job submit`'s entrypoint, shell-expanded, run with --cfg job from another folder, as Ray
    runs it in its copy of the working dir); `collect` (`make test` collecting one file); `skip` (not run)."""
    why: str = ""
    """For `skip`: why it is not run, and what covers it instead."""


RULES = [
    Rule(r"^make run ARGS=", "cfg"),
    Rule(r"^make run$", "check"),
    Rule(r"^make test$", "collect"),
    Rule(r"ray job submit .* -- ", "entrypoint"),
    Rule(r"^export RAY_AUTH_|^\.venv/bin/ray |^CUDA_VISIBLE_DEVICES=\d \.venv/bin/ray ", "skip",
         "talks to or starts a Ray cluster (tests/e2e/test_ray_job.py starts one on this machine, submits a job to "
         "it and stops it without `ray stop`)"),
    Rule(r"^mkdir -p /tmp/rn/n1", "skip", "a step of the two-nodes rehearsal on 2 GPUs (tests/gpu/gpu2_ray_nodes.sh)"),
    Rule(r"^export RLX_QWEN_CODER_SOURCE=", "skip", "points rlx at a model file the reader has"),
    Rule(r"^git -C <verl clone>", "skip", "needs a clone of verl"),
    Rule(r"gpu_suite\.sh list$|^GPU_SUITE_PREFLIGHT=0 bash tests/gpu/gpu_suite\.sh \d$", "as_is"),
    Rule(r"^bash tests/gpu/gpu_suite\.sh \d$", "skip",
         "needs a GPU; its CPU dry run (GPU_SUITE_PREFLIGHT=0) is in docs/testing.md and runs here"),
    Rule(r"tests/gpu/gpu2_\w+\.sh", "skip",
         "a CPU dry run of Ray jobs that takes minutes on 2 cores (gpu2_jobs.sh rl: ~170 s, gpu2_ray_nodes.sh --cpu: "
         "~90 s); tests/e2e/test_recipe_scripts.py runs gpu2_jobs.sh with stand-in interpreters (the venv it picks, "
         "its exit status when a job fails)"),
    Rule(r"tests/gpu/gpu_tool_recipe\.sh", "skip", "SFT of a 0.5B model and vLLM on a GPU"),
    Rule(r"-m pytest tests/e2e/test_ulysses\.py -k two_gpus", "skip", "needs 2 GPUs (NCCL)"),
    Rule(r"bash examples/", "cfg"),
    Rule(r"-m rlx\.trainer\.main_ppo .*<", "help"),
    Rule(r"-m rlx\.trainer\.main_ppo ", "cfg"),
    Rule(r"^\.venv/bin/python (scripts|benchmarks)/\S+\.py|^\.venv/bin/python -m rlx\.models\.random_weights", "help"),
    Rule(r"^\+?[a-z_]+(\.\w+)+=", "fragment"),
]


def _drop_comment(line: str) -> str:
    """The line without its `# ...` comment (a # outside quotes, at the start or after a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _open_quote(text: str) -> bool:
    quote = None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
    return quote is not None


def doc_commands() -> list[Command]:
    """Every command of every ```bash block of README.md and docs/*.md, each text once."""
    seen: dict[str, Command] = {}
    for path in DOCS:
        text = path.read_text()
        for block in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S):
            first = text[:block.start(1)].count("\n") + 1
            pending, start = "", first
            for n, line in enumerate(block.group(1).splitlines()):
                line = _drop_comment(line)
                if not pending:
                    start = first + n
                if line.endswith("\\"):
                    pending += line[:-1].rstrip() + " "
                    continue
                if _open_quote(pending + line):  # a quoted argument that goes on over the next line
                    pending += line + " "
                    continue
                command = " ".join((pending + line).split())
                pending = ""
                if command and command not in seen:
                    seen[command] = Command(command, f"{path.relative_to(ROOT)}:{start}")
    return list(seen.values())


def rule_of(command: Command) -> Rule | None:
    return next((r for r in RULES if re.search(r.pattern, command.text)), None)


COMMANDS = doc_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 50, [c.text for c in COMMANDS]


def test_every_command_has_a_rule_and_every_rule_a_command():
    unclassified = [f"{c.where}: {c.text}" for c in COMMANDS if rule_of(c) is None]
    assert not unclassified, "commands of the docs that no rule of tests/unit/test_doc_commands.py classifies " \
                             "(add a rule: how to run it cheaply, or why it is not run):\n" + "\n".join(unclassified)
    used = {id(rule_of(c)) for c in COMMANDS}
    assert not [r.pattern for r in RULES if id(r) not in used], "rules that no command matches any more"
    for r in RULES:
        assert (r.form == "skip") == bool(r.why), r


BARE = re.compile(r"(?:^|(?<!-m)[\s;(|&`])(python3?|ray|torchrun|pytest|pip) ")


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_command_names_the_venv_and_existing_files(command):
    """No bare interpreter or CLI (with no venv activated it is the system's, without rlx's dependencies), and every
    file of the repository it names exists."""
    assert not BARE.search(command.text), f"{command.where}: use .venv/bin/<tool>: {command.text}"
    for path in re.findall(r"(?<![\w/.~-])((?:examples|scripts|benchmarks|tests|docs|rlx)/[\w./-]+\.(?:sh|py|yaml))",
                           command.text):
        assert (ROOT / path).is_file(), f"{command.where}: {path} does not exist"


def test_inline_commands_name_the_venv():
    """The same for commands written inline in the prose (`python ...`, `pip install ...`): verl's own command lines
    and the name of pip's download step excepted."""
    bad = []
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for span in re.findall(r"`([^`]+)`", line):
                if re.match(r"(python3?|torchrun|pytest|pip) ", span) \
                        and not re.match(r"python3? -m (verl\.|pip )|pip download", span):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {span}")
    assert not bad, "\n".join(bad)
