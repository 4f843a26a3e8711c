"""End-to-end half of tests/unit/test_preflight.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested."""
import subprocess
import sys
import time
from conftest import REPO  # load_config: the quickstart job's config


def test_entry_point_exits_2_in_seconds(tmp_path):
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", "--config-name", "quickstart",
                           f"data.train_files={tmp_path}/t.parquet"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "data.train_files" in proc.stderr and "Traceback" not in proc.stderr
    assert "Ray instance" not in proc.stdout + proc.stderr and "raylet" not in proc.stderr
    assert time.time() - start < 30
