"""End-to-end half of tests/unit/test_plot_metrics.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
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
