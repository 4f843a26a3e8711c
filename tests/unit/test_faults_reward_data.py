"""Issue 39's fault matrix, the rows of slow or failing rewards (and, below, of bad data): each test fails on the code
before rlx.reward's scoring pool and the data checks, and passes after.

| row | test |
|---|---|
| a reward function that sleeps 60 s per call: a silent hang, calls in series, no timeout | test_hung_call_is_killed_and_scores_the_timeout_score, test_calls_run_in_parallel, test_slow_scoring_logs_a_progress_line |
| a reward function that raises on some rows: a raw 36-line traceback without sample or data_source | test_raising_function_is_one_line_naming_function_sample_and_source, test_raising_and_dying_functions_in_the_pool |
| a chat message `content` given as bytes: trains on the repr, silently | test_message_content_that_is_not_text_is_refused_with_file_and_row |
| a string column with invalid UTF-8: a bare codec error without file or row | test_invalid_utf8_names_the_file_column_and_row |
| (issue 51) a ground truth given as bytes: every response compared against "b'3'", silently | test_ground_truth_that_is_bytes_is_refused_with_file_and_row |
| (item 7) a reward or tool file in a world-writable place | test_code_in_a_world_writable_place_is_loaded_with_a_warning |

The tests that start the scoring processes are marked e2e (tests/markers.py); the rest run in this process.
"""
from __future__ import annotations

import logging
import pickle

import pytest
import torch

from rlx.config.schema import CustomRewardFunctionConfig
from rlx.models import build_byte_tokenizer
from rlx.protocol import Batch
from rlx.reward import manager as manager_module
from rlx.reward.functions import FileFunction, default_compute_score, load_reward_fn
from rlx.reward.manager import RewardError, RewardFunctionError, RewardManager, scoring_processes

REWARD_FILE = '''
import os
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, delay=0.0):
    if solution_str.startswith("sleep"):
        time.sleep(60)
    if solution_str.startswith("raise"):
        return 1 / 0
    if solution_str.startswith("exit"):
        os._exit(3)
    time.sleep(delay)
    return float(solution_str == ground_truth)
'''


def _batch(tok, texts, sources=None, resp_len=8):
    rows, masks = [], []
    for t in texts:
        ids = (tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:resp_len]
        masks.append([1] * len(ids) + [0] * (resp_len - len(ids)))
        rows.append(ids + [tok.pad_token_id] * (resp_len - len(ids)))
    n = len(texts)
    return Batch({"responses": torch.tensor(rows), "response_mask": torch.tensor(masks)},
                 {"data_source": sources or ["src"] * n, "ground_truth": ["4"] * n, "extra_info": [{}] * n})


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


def _fn(path, **kwargs):
    return load_reward_fn(CustomRewardFunctionConfig(path=str(path), reward_kwargs=kwargs), {})


# ---- raising functions ---------------------------------------------------------------------------------
def test_raising_function_is_one_line_naming_function_sample_and_source(reward_file, caplog):
    """In the driver's process (num_workers=1): the first raising sample is named, with its data_source, in one line
    (the trainer ends the run with it, as with a NaN score: RewardFunctionError is a RewardError); the user's
    traceback is in the log."""
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, _fn(reward_file), num_workers=1)
    with caplog.at_level(logging.ERROR, logger="rlx.reward.manager"), pytest.raises(RewardFunctionError) as e:
        manager(_batch(tok, ["4", "raise", "raise"], sources=["a", "b/src", "c"]))
    msg = str(e.value)
    assert isinstance(e.value, RewardError) and "\n" not in msg, msg
    assert "compute_score" in msg and str(reward_file) in msg and "sample 1" in msg and "'b/src'" in msg, msg
    assert "ZeroDivisionError" in msg and "1 more samples" in msg and "Fix:" in msg, msg
    logged = caplog.text
    assert "Traceback" in logged and "my_reward.py" in logged and "return 1 / 0" in logged, logged
    assert "rlx/reward" not in logged.split("Traceback", 1)[1], logged  # the user's frames, not rlx's


def test_raising_batch_function_names_the_function(tmp_path):
    path = tmp_path / "batch_reward.py"
    path.write_text("def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
                    "    raise KeyError('answer')\n")
    tok = build_byte_tokenizer()
    with pytest.raises(RewardFunctionError, match=r"compute_score .*reward_manager=batch\) raised KeyError"):
        RewardManager(tok, _fn(path), batched=True)(_batch(tok, ["4", "5"]))


# ---- slow functions: progress ----------------------------------------------------------------------------
def test_slow_scoring_logs_a_progress_line(reward_file, caplog, monkeypatch):
    """A step whose scoring takes longer than PROGRESS_EVERY_S (30 s; shortened here) says how far it got."""
    monkeypatch.setattr(manager_module, "PROGRESS_EVERY_S", 0.05)
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, _fn(reward_file, delay=0.03), num_workers=1)
    with caplog.at_level(logging.INFO, logger="rlx.reward.manager"):
        scores, _ = manager(_batch(tok, ["4"] * 6))
    assert scores.sum().item() == 6.0
    lines = [r.getMessage() for r in caplog.records if "responses scored after" in r.getMessage()]
    assert lines and lines[0].startswith("rlx: reward: ") and "/6 responses" in lines[0], lines
    assert "compute_score" in lines[0] and "driver's process" in lines[0], lines


# ---- where the calls run -------------------------------------------------------------------------------
def test_where_the_calls_run(reward_file, caplog):
    """reward_model.num_workers=null: 8 processes for a custom function, the driver's process for the built-in
    rules; a number is taken as it is. A function that does not pickle scores in the driver's process, said once."""
    from conftest import load_config

    custom = _fn(reward_file)
    assert scoring_processes(load_config([]), custom) == manager_module.DEFAULT_CUSTOM_WORKERS == 8
    assert scoring_processes(load_config([]), default_compute_score) == 1
    assert scoring_processes(load_config(["reward_model.num_workers=3"]), default_compute_score) == 3
    assert scoring_processes(load_config(["reward.num_workers=2"]), custom) == 2  # verl 0.9.1's spelling
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, lambda **kw: 1.0, num_workers=4, timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="rlx.reward.manager"):
        scores, _ = manager(_batch(tok, ["4", "5"]))
        manager(_batch(tok, ["4"]))
    assert scores.sum().item() == 2.0 and not manager.in_pool
    notes = [r.getMessage() for r in caplog.records if "does not pickle" in r.getMessage()]
    assert len(notes) == 1 and "reward_model.num_workers=4" in notes[0], notes


def test_a_file_function_pickles_and_reloads(reward_file):
    """The custom function pickles as (path, name, kwargs) and loads its file again where it is unpickled."""
    fn = _fn(reward_file, delay=0.0)
    assert isinstance(fn, FileFunction) and fn.kwargs == {"delay": 0.0}
    again = pickle.loads(pickle.dumps(fn))
    assert again.fn is not fn.fn and again(data_source="s", solution_str="4", ground_truth="4") == 1.0


@pytest.mark.parametrize("override,message", [
    ("reward_model.num_workers=0", "reward_model.num_workers=0 must be a whole number"),
    ("reward_model.score_timeout_s=0", r"reward_model.score_timeout_s=0(\.0)? must be a positive number"),
])
def test_scoring_keys_are_checked(override, message):
    from conftest import load_config

    with pytest.raises(ValueError, match=message):
        load_config([override])


# ---- data ------------------------------------------------------------------------------------------------
def _data_cfg():
    from rlx.config.schema import DataConfig

    return DataConfig(train_files=None, val_files=None, max_prompt_length=32, max_response_length=8,
                      train_batch_size=2, truncation="error", apply_chat_template=True, return_raw_chat=False)


def _rows(contents):
    return [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": c}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"index": i}}
            for i, c in enumerate(contents)]


def test_message_content_that_is_not_text_is_refused_with_file_and_row(tmp_path):
    """A binary column (bytes) as a message's content: refused with the file and the row, not trained on as
    "b'8 9 5 3 ->'"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlx.data.dataset import RLDataset

    good, bad = tmp_path / "good.parquet", tmp_path / "bytes.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(["1 2 ->"])), good)
    pq.write_table(pa.Table.from_pylist(_rows([b"7 7 ->", b"8 9 5 3 ->"])), bad)
    with pytest.raises(ValueError) as e:
        RLDataset([str(good), str(bad)], build_byte_tokenizer(), _data_cfg())
    msg = str(e.value)
    assert str(bad) in msg and "row 0" in msg and "message 0" in msg and "bytes" in msg and "Fix:" in msg, msg


@pytest.mark.parametrize("truth", [b"3", [b"3", b"03"]])
def test_ground_truth_that_is_bytes_is_refused_with_file_and_row(tmp_path, truth):
    """Issue 51: a binary reward_model.ground_truth (alone or in a list) is refused with the file, the row and the
    fix, as bytes prompts are, not trained on with every response compared against "b'3'"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlx.data.dataset import RLDataset

    good, path = tmp_path / "good.parquet", tmp_path / "truth.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(["1 2 ->", "3 4 ->"])), good)
    rows = _rows(["5 6 ->", "7 8 ->"])
    rows[0]["reward_model"]["ground_truth"] = None  # a column of one type: the row before has none
    rows[1]["reward_model"]["ground_truth"] = truth
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError) as e:
        RLDataset([str(good), str(path)], build_byte_tokenizer(), _data_cfg())
    msg = str(e.value)
    assert str(path) in msg and "row 1" in msg and "reward_model.ground_truth" in msg and "bytes" in msg, msg
    assert "Fix: write each ground_truth as a string" in msg and "\n" not in msg, msg


def test_invalid_utf8_names_the_file_column_and_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlx.data.dataset import RLDataset

    table = pa.Table.from_pylist(_rows(["1 2 ->", "3 4 ->", "5 6 ->"]))
    sources = pa.array([b"openai/gsm8k", b"openai/gsm8k", b"open\xffai"], pa.binary()).view(pa.string())
    path = tmp_path / "latin.parquet"
    pq.write_table(table.set_column(table.column_names.index("data_source"), "data_source", sources), path)
    with pytest.raises(ValueError) as e:
        RLDataset(str(path), build_byte_tokenizer(), _data_cfg())
    msg = str(e.value)
    assert str(path) in msg and "column 'data_source', row 2" in msg and "UTF-8" in msg and "Fix:" in msg, msg
    assert "\\xff" in msg, msg


def test_code_in_a_world_writable_place_is_loaded_with_a_warning(tmp_path, reward_file, caplog):
    """The custom reward and tool files (and a custom dataset class) load, with one warning line each when another
    user could have changed them; a private folder gives none."""
    import os

    from conftest import load_config
    from rlx.trainer.preflight import _warn_world_writable_code, world_writable

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    planted = shared / "reward.py"
    planted.write_text(REWARD_FILE)
    tools = tmp_path / "tools.py"
    tools.write_text("def add(a: int, b: int) -> int:\n    return a + b\n")
    os.chmod(tools, 0o666)
    assert world_writable(str(reward_file)) is None  # pytest's own folder: private
    assert "folder" in world_writable(str(planted)) and "writable by every user" in world_writable(str(tools))
    cfg = load_config([f"custom_reward_function.path={planted}",
                       f"actor_rollout_ref.rollout.multi_turn.function_tool_path={tools}"], validate=False)
    with caplog.at_level(logging.WARNING, logger="rlx"):
        _warn_world_writable_code(cfg)
    lines = [r.getMessage() for r in caplog.records if "world-writable" in r.getMessage()]
    assert len(lines) == 2 and all(line.startswith("rlx: warning: ") and "Fix:" in line for line in lines), lines
    assert "custom_reward_function.path" in lines[0] and str(planted) in lines[0], lines
    assert "function_tool_path" in lines[1] and str(tools) in lines[1], lines
    assert _fn(planted)(data_source="s", solution_str="4", ground_truth="4") == 1.0  # still loaded
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlx"):
        _warn_world_writable_code(load_config([f"custom_reward_function.path={reward_file}"], validate=False))
    assert not [r for r in caplog.records if "world-writable" in r.getMessage()]
