"""tests/gpu_groups.py: every GPU test is in exactly one group, every group's entry names collected tests, and each
group's estimate fits one run (tests/gpu/gpu_suite.sh)."""
import os
import subprocess
import sys

from conftest import REPO
from gpu_groups import BUDGET_S, GROUPS


def _collected_gpu_tests() -> tuple[list[str], set[str]]:
    """The GPU tests' ids, and the test files skipped as a whole here (e.g. test_liger_gpu.py without Liger)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "tests", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    skipped = {line.split()[2].split(":")[0] for line in lines if line.startswith("SKIPPED [")}
    return [line for line in lines if line.startswith("tests/") and "::" in line], skipped


def test_each_group_fits_one_run():
    for k, g in GROUPS.items():
        assert g.seconds() <= BUDGET_S, (k, g.seconds())
        assert g.tests and g.gpus == (2 if any("two_gpus" in t for t in g.tests) else 1), k
