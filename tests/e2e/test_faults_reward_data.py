"""End-to-end half of tests/unit/test_faults_reward_data.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import logging
import time
import pytest
from rlx.models import build_byte_tokenizer
from rlx.reward.manager import RewardError, RewardFunctionError, RewardManager
from unit.test_faults_reward_data import _batch, _fn
from unit.test_faults_reward_data import reward_file  # noqa: F401 -- fixtures


# ---- the pool (these start processes) -------------------------------------------------------------------
@pytest.mark.e2e
def test_hung_call_is_killed_and_scores_the_timeout_score(reward_file):
    """A call past score_timeout_s gets timeout_score and is counted; its process is killed, not abandoned, and the
    next step scores with a fresh one."""
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, _fn(reward_file), num_workers=2, timeout_s=2.0, timeout_score=-1.0)
    try:
        start = time.monotonic()
        scores, _ = manager(_batch(tok, ["4", "sleep", "5", "4"]))
        assert time.monotonic() - start < 30
        assert scores.sum(-1).tolist() == [1.0, -1.0, 0.0, 1.0] and manager.timeouts == 1 and manager.in_pool
        workers = manager._pool.workers
        assert len(workers) == 2 and all(w.alive() for w in workers)
        scores, _ = manager(_batch(tok, ["4", "4"]))
        assert scores.sum(-1).tolist() == [1.0, 1.0] and manager.timeouts == 0  # counted per call
    finally:
        manager.close()


@pytest.mark.e2e
def test_calls_run_in_parallel(reward_file):
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, _fn(reward_file, delay=1.5), num_workers=4, timeout_s=60.0)
    try:
        manager(_batch(tok, ["4"]))  # the processes start
        start = time.monotonic()
        scores, _ = manager(_batch(tok, ["4", "5", "4", "4"]))
        elapsed = time.monotonic() - start
        assert scores.sum(-1).tolist() == [1.0, 0.0, 1.0, 1.0]
        assert elapsed < 4.5, f"4 calls of 1.5 s in 4 processes took {elapsed:.1f} s"
    finally:
        manager.close()


@pytest.mark.e2e
def test_raising_and_dying_functions_in_the_pool(reward_file, caplog):
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, _fn(reward_file), num_workers=2, timeout_s=60.0)
    try:
        with caplog.at_level(logging.ERROR, logger="rlx.reward.manager"), pytest.raises(RewardFunctionError) as e:
            manager(_batch(tok, ["4", "raise"], sources=["a", "b/src"]))
        assert "raised ZeroDivisionError" in str(e.value) and "sample 1 (data_source='b/src')" in str(e.value)
        assert "return 1 / 0" in caplog.text
        with pytest.raises(RewardFunctionError) as e:
            manager(_batch(tok, ["exit", "4"], sources=["x/src", "a"]))
        assert "exit code 3" in str(e.value) and "sample 0 (data_source='x/src')" in str(e.value), str(e.value)
        scores, _ = manager(_batch(tok, ["4", "4"]))  # the pool goes on with a fresh process
        assert scores.sum(-1).tolist() == [1.0, 1.0]
    finally:
        manager.close()


@pytest.mark.e2e
def test_timeouts_are_said_each_step_with_function_count_and_limit(reward_file, caplog):
    """Issue 51: a step with calls past score_timeout_s says so on the console (the function, the count, the limit),
    not only in the reward/timeouts metric; a step without any says nothing."""
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, _fn(reward_file), num_workers=2, timeout_s=1.0)
    try:
        with caplog.at_level(logging.INFO, logger="rlx.reward.manager"):
            manager(_batch(tok, ["4", "sleep", "4"]))
            lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(lines) == 1 and lines[0].startswith("rlx: reward: 1/3 calls of reward function "), lines
            assert "compute_score" in lines[0] and str(reward_file) in lines[0], lines
            assert "reward_model.score_timeout_s=1.0 s" in lines[0] and "timeout_score=0.0" in lines[0], lines
            caplog.clear()
            manager(_batch(tok, ["4", "4"]))
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        manager.close()


@pytest.mark.e2e
def test_a_step_whose_every_call_times_out_stops_in_one_line(reward_file):
    """Issue 51: every call of the step past score_timeout_s: every score would be timeout_score and the gradient
    zero; a RewardError (the trainer's one `rlx: training stopped: step N:` line) names the function, the limit and
    the key to raise."""
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, _fn(reward_file), num_workers=2, timeout_s=1.0)
    try:
        with pytest.raises(RewardError) as e:
            manager(_batch(tok, ["sleep", "sleep"]))
        msg = str(e.value)
        assert "\n" not in msg and "compute_score" in msg and str(reward_file) in msg, msg
        assert "all 2 calls" in msg and "reward_model.score_timeout_s=1.0 s" in msg, msg
        assert "Fix: raise reward_model.score_timeout_s" in msg, msg
    finally:
        manager.close()


@pytest.mark.e2e
def test_a_hung_batch_function_is_killed_and_stops_the_step(tmp_path):
    """reward_model.reward_manager=batch: the one call per batch runs in a process of its own when there is a
    timeout; past it, the process is killed, and as every call of the step timed out, a RewardError names the
    function, the limit and the key to raise."""
    path = tmp_path / "batch_reward.py"
    path.write_text("import time\n"
                    "def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
                    "    if 'sleep' in solution_strs:\n"
                    "        time.sleep(600)\n"
                    "    return [1.0 for _ in solution_strs]\n")
    tok = build_byte_tokenizer()
    manager = RewardManager(tok, _fn(path), batched=True, timeout_s=2.0, timeout_score=-1.0)
    try:
        start = time.monotonic()
        with pytest.raises(RewardError) as e:
            manager(_batch(tok, ["4", "sleep"]))
        assert time.monotonic() - start < 30 and manager.in_pool
        msg = str(e.value)
        assert "compute_score" in msg and "reward_model.score_timeout_s=2.0 s" in msg and "Fix: raise" in msg, msg
        scores, _ = manager(_batch(tok, ["4", "5"]))  # a fresh process scores the next batch
        assert scores.sum(-1).tolist() == [1.0, 1.0] and manager.timeouts == 0
    finally:
        manager.close()
