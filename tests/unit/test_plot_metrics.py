"""scripts/plot_metrics.py (a PNG of four panels from metrics.jsonl files) and scripts/val_summary.py (accuracy and
format compliance per validation, from trainer.validation_data_dir's dumps)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

pytest.importorskip("matplotlib")  # the optional extra rlx[plot]


def _write_run(tmp_path: Path) -> tuple[Path, Path]:
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "w") as f:
        f.write(json.dumps({"step": 0, "val/openai/gsm8k/reward/mean": 0.02}) + "\n")
        for step in (1, 2, 3):
            f.write(json.dumps({"step": step, "critic/score/mean": 0.1 * step, "response_length/mean": 100 + step,
                                "actor/entropy": 1.0 / step, "timing_s/step": 1.0}) + "\n")
    val = tmp_path / "val"
    val.mkdir()
    rows = {0: [("no answer", "3"), ("#### 3", "3"), ("#### 4", "3")], 5: [("so #### 3", "3"), ("#### 7", "7")]}
    for step, pairs in rows.items():
        with open(val / f"{step}.jsonl", "w") as f:
            for out, gt in pairs:
                f.write(json.dumps({"input": "q", "output": out, "gts": gt, "score": 0.0, "step": step}) + "\n")
    return metrics, val


def test_val_summary_reads_accuracy_and_format(tmp_path):
    import val_summary

    _, val = _write_run(tmp_path)
    rows = val_summary.summarise(str(val))
    assert [r["step"] for r in rows] == [0, 5]
    assert rows[0]["n"] == 3 and rows[0]["strict"] == pytest.approx(1 / 3) and rows[0]["format"] == pytest.approx(2 / 3)
    assert rows[1]["strict"] == 1.0 and rows[1]["format"] == 1.0
