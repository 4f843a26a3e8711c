"""scripts/run_*_tiny_cpu.sh, the CPU recipes a newcomer runs first: each one picks the project's interpreter (not a
bare system python3, which lacks rlx's dependencies) and its command line passes `--check` (composition,
validation and the preflight; no Ray, no training)."""
from __future__ import annotations

from pathlib import Path


from conftest import REPO

SCRIPTS = sorted(p.name for p in (Path(REPO) / "scripts").glob("run_*_tiny_cpu.sh"))


def test_the_five_recipes_are_found():
    assert {"run_grpo_tiny_cpu.sh", "run_drgrpo_tiny_cpu.sh", "run_dapo_tiny_cpu.sh", "run_gspo_tiny_cpu.sh",
            "run_reinforce_pp_tiny_cpu.sh"} <= set(SCRIPTS)
