"""End-to-end half of tests/unit/test_reward.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import json
import subprocess
import sys
from rlx.config.schema import DataConfig
from rlx.data.dataset import RLDataset
from rlx.reward.functions import default_compute_score
from rlx.models import build_byte_tokenizer
from unit.test_reward import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    PREPARE,
)


def test_prepare_gsm8k_script(tmp_path):
    records = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i:,}"}
               for i in range(498, 503)]
    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    (in_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (in_dir / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    proc = subprocess.run([sys.executable, str(PREPARE), "--input_dir", str(in_dir), "--output_dir", str(out_dir)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    import pyarrow.parquet as pq
    train = pq.read_table(out_dir / "train.parquet").to_pylist()
    assert len(train) == 5 and len(pq.read_table(out_dir / "test.parquet")) == 2
    r = train[2]
    assert r["data_source"] == "openai/gsm8k" and r["ability"] == "math"
    assert r["prompt"] == [{"role": "user", "content": "What is 500 + 500? Let's think step by step and output the "
                                                       "final answer after \"####\"."}]
    assert r["reward_model"] == {"style": "rule", "ground_truth": "1000"}  # "1,000" -> commas stripped
    assert r["extra_info"] == {"split": "train", "index": 2, "answer": records[2]["answer"],
                               "question": records[2]["question"]}
    # the result loads as an RLDataset and the reference answer earns the full reward
    tok = build_byte_tokenizer()
    cfg = DataConfig(max_prompt_length=128)
    ds = RLDataset(str(out_dir / "train.parquet"), tok, cfg)
    item = ds[2]
    assert default_compute_score(item["data_source"], records[2]["answer"], item["ground_truth"]) == 1.0
