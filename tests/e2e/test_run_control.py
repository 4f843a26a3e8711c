"""End-to-end half of tests/unit/test_run_control.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import os
import signal
import subprocess
import sys
import time
import pytest
from rlx import checkpoint as ckpt
from conftest import REPO
from e2e.test_e2e import SMALL
from unit.test_run_control import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _SIGTERM_AT,
)


def test_nan_reward_stops_the_run_naming_the_function(ray_local, tmp_path, capsys):
    from rlx.trainer.main_ppo import main

    reward = tmp_path / "nan_reward.py"
    reward.write_text("def broken_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float('nan')\n")
    code = main(["--config-name", "quickstart", *SMALL, "actor_rollout_ref.rollout.name=hf",
                 "trainer.val_before_train=False", f"custom_reward_function.path={reward}",
                 "custom_reward_function.name=broken_score", f"trainer.default_local_dir={tmp_path}/ckpt",
                 "trainer.logger=console"])
    err = capsys.readouterr().err
    assert code == 1
    assert "rlx: training stopped: step 1: reward function broken_score" in err and str(reward) in err
    assert "data_source='synthetic/digits'" in err and "reward_model.non_finite_score" in err


def test_sigterm_ends_the_run_like_ctrl_c(tmp_path):
    """SIGTERM mid-run: exit 143, no stack dump, every process of the run gone, the last checkpoint complete."""
    import psutil

    root = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlx.trainer.main_ppo", "--config-name", "quickstart", *SMALL,
         "trainer.total_training_steps=100",
         "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.val_before_train=False",
         "actor_rollout_ref.rollout.name=hf", "trainer.logger=console", f"trainer.default_local_dir={root}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("step:2 "):
                break
        assert proc.poll() is None, proc.stderr.read()
        family = psutil.Process(proc.pid).children(recursive=True)
        assert any("raylet" in p.name() for p in family)
        import json

        from rlx.checkpoint.lock import LOCK
        assert json.loads((root / LOCK).read_text())["pid"] == proc.pid  # the run holds its checkpoint folder
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "Fatal Python error" not in err and "Aborted" not in err, err[-3000:]
    assert "rlx: SIGTERM at step" in err and "is kept" in err
    # a quiet console: workers' output stays in Ray's log folder, whose path is printed
    assert "rlx: worker output (vLLM, FSDP, Ray) goes to" in err and "(ActorRolloutRefWorker pid=" not in err
    assert "Token authentication is enabled" not in err
    deadline = time.time() + 15
    while time.time() < deadline:
        left = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.5)
    assert not left, [(p.pid, p.name()) for p in left]
    steps = ckpt.list_steps(str(root))
    assert steps and steps[-1] >= 2 and ckpt.verify(ckpt.step_dir(str(root), steps[-1])) == []
    assert not (root / LOCK).exists(), "the lock is released when the run ends"


@pytest.mark.parametrize("where,line", [("preflight", "rlx: SIGTERM before training started."),
                                        ("ray_init", "rlx: SIGTERM before training started."),
                                        ("cleanup", "rlx: SIGTERM at step 3: stopped the workers."),
                                        ("c_code", "rlx: SIGTERM at step 3: stopped the workers.")])
def test_sigterm_at_any_moment_ends_with_143_and_one_line(tmp_path, where, line):
    """Before Ray (preflight), while Ray starts (its own handler calls sys.exit), while the workers are stopped
    (the cleanup runs to its end first), inside C code that turns the handler's exception into a SystemError (once
    an exit 1 with a traceback): exit 143 and the line Ctrl-C gives, no traceback, the lock released."""
    from rlx.checkpoint.lock import LOCK

    root = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_AT, where, "--config-name", "quickstart",
                           f"trainer.default_local_dir={root}", "trainer.save_freq=1", "trainer.logger=console"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert line in proc.stderr and "No checkpoint was saved" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert where != "cleanup" or proc.stderr.index("cleanup finished") < proc.stderr.index(line)
    assert not (root / LOCK).exists()
