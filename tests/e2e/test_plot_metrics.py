"""scripts/plot_metrics.py (a PNG of four panels from metrics.jsonl files) and scripts/val_summary.py (accuracy and
format compliance per validation, from trainer.validation_data_dir's dumps)."""
from __future__ import annotations
import os
import subprocess
import sys
import pytest

from unit.test_plot_metrics import REPO, _write_run

sys.path.insert(0, str(REPO / "scripts"))
pytest.importorskip("matplotlib")  # the optional extra rlx[plot]


def test_plot_metrics_writes_a_png(tmp_path):
    metrics, val = _write_run(tmp_path)
    for spec, name in ((f"{metrics}=run", "a.png"), (f"{metrics}=run={val}", "b.png")):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_metrics.py"), spec, "--out", str(out)],
                              capture_output=True, text=True, env=dict(os.environ, MPLBACKEND="Agg"))
        assert proc.returncode == 0, proc.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
