"""The layout of the shell entry points and how they pick their interpreter.

Recipes live in examples/<algorithm folder>/ (as verl groups its own), the GPU runs in tests/gpu/, benchmarks in
benchmarks/, and scripts/ keeps the tools. Every recipe and GPU run picks the project's interpreter through
scripts/lib/python.sh ($PYTHON, else the .venv that scripts/setup.sh makes; never a bare system python3, which lacks
rlx's dependencies). The CPU recipes (examples/*/run_*_tiny_cpu.sh), the ones a newcomer runs first, pass `--check`
(composition, validation and the preflight; no Ray, no training): tests/e2e/test_recipe_scripts.py."""
from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

ROOT = Path(REPO)
SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("examples/*/run_*_tiny_cpu.sh"))
"""The CPU recipes, relative to the repository."""
SHELL = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("examples/**/*.sh"), *ROOT.glob("tests/gpu/*.sh")])
"""Every recipe and GPU run: each picks its interpreter through scripts/lib/python.sh."""
SOURCE = 'source "$ROOT/scripts/lib/python.sh"'


def test_the_five_cpu_recipes_are_found_in_their_algorithm_folders():
    assert set(SCRIPTS) >= {
        "examples/grpo_trainer/run_grpo_tiny_cpu.sh", "examples/grpo_trainer/run_drgrpo_tiny_cpu.sh",
        "examples/dapo_trainer/run_dapo_tiny_cpu.sh", "examples/gspo_trainer/run_gspo_tiny_cpu.sh",
        "examples/reinforce_plus_plus_trainer/run_reinforce_pp_tiny_cpu.sh"}


def test_scripts_holds_tools_only():
    """No recipe, benchmark or GPU run is left in scripts/ (nor a shim at its old path)."""
    misplaced = [p.name for p in (ROOT / "scripts").iterdir()
                 if re.match(r"(run_.*\.sh|bench_.*\.py|gpu.*\.sh|memory_(check|census)\.py)$", p.name)]
    assert not misplaced, f"{misplaced}: recipes go to examples/<algorithm>/, benchmarks to benchmarks/, " \
                          "GPU runs to tests/gpu/"


def test_every_script_picks_the_venv_through_the_shared_helper():
    assert len(SHELL) >= 19, SHELL
    for rel in SHELL:
        text = (ROOT / rel).read_text()
        if 'exec bash "$HERE/' in text:  # a recipe that hands over to another one (the arith variant of SmolLM2)
            target = re.search(r'exec bash "\$HERE/(\S+)"', text).group(1)
            assert (ROOT / rel).parent.joinpath(target).is_file(), rel
            continue
        root = re.search(r'^ROOT="\$\(cd "\$\(dirname "\$\{BASH_SOURCE\[0\]\}"\)/(\S*)" && pwd\)"$', text, re.M)
        assert root, f"{rel}: no ROOT line"
        assert ((ROOT / rel).parent / root.group(1)).resolve() == ROOT, f"{rel}: ROOT is not the repository"
        assert SOURCE in text and text.index(SOURCE) > root.start(), f"{rel}: does not source scripts/lib/python.sh"
        assert not re.search(r'PYTHON="?\$\{PYTHON:-python3\}', text), f"{rel}: defaults to the system python3"
