"""End-to-end half of tests/unit/test_tracking_wandb.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import base64
import glob
import json
import os
import signal
import subprocess
import sys
import time
from conftest import REPO, load_config
from unit.test_tracking_wandb import (
    KEY,
    ONLINE_CHILD,
    apply_env,
    history,
    isolated_env,
    offline_run_dir,
    run_record,
)
from unit.test_tracking_wandb import listener  # noqa: F401 -- fixtures


def test_no_key_logs_offline_into_the_runs_folder(tmp_path, monkeypatch, capfd, listener):
    from rlx.trainer.tracking import Tracker, wandb_has_credentials

    apply_env(monkeypatch, isolated_env(tmp_path, listener))
    assert not wandb_has_credentials()
    out = tmp_path / "run"
    cfg = load_config(["trainer.logger=[console,wandb]", f"trainer.default_local_dir={out}",
                       "trainer.project_name=proj", "trainer.experiment_name=exp1"])
    log_dir = str(out / "logs")
    tracker = Tracker(cfg, log_dir)
    logged = [{"critic/score/mean": 0.25 * step, "actor/pg_loss": -1.5 + step, "timing_s/step": 2.0}
              for step in (1, 2, 3)]
    for step, metrics in enumerate(logged, start=1):
        tracker.log(metrics, step=step)
    tracker.log_generations([("1+1=", "2", 1.0)], step=3)
    tracker.close()
    run_dir = offline_run_dir(capfd.readouterr().err, log_dir)  # under <default_local_dir>/logs
    rows = history(run_dir)
    table = {k: rows[-1].pop(k) for k in list(rows[-1]) if k.startswith("val/generations/")}
    assert (table["val/generations/_type"], table["val/generations/nrows"]) == ("table-file", 1), table
    assert rows == [{"_step": step, **m} for step, m in enumerate(logged, start=1)]
    run = run_record(run_dir)
    assert (run.project, run.display_name) == ("proj", "exp1")  # trainer.project_name / experiment_name, as verl
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["trainer"]["experiment_name"] == "exp1" and config["trainer"]["logger"] == ["console", "wandb"]
    assert listener.requests == []  # nothing reached W&B's address or a proxy


def test_wandb_dir_names_the_folder(tmp_path, monkeypatch, capfd, listener):
    from rlx.trainer.tracking import Tracker

    apply_env(monkeypatch, isolated_env(tmp_path, listener))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    cfg = load_config(["trainer.logger=[wandb]", f"trainer.default_local_dir={tmp_path / 'run'}"])
    tracker = Tracker(cfg, str(tmp_path / "run" / "logs"))
    tracker.log({"x": 1.0}, step=1)
    tracker.close()
    run_dir = offline_run_dir(capfd.readouterr().err, str(tmp_path / "elsewhere"))
    assert history(run_dir) == [{"_step": 1, "x": 1.0}]
    assert listener.requests == []


def test_with_a_key_it_logs_online(tmp_path, listener):
    """With WANDB_API_KEY the run goes online: its first request reaches the W&B address, authenticated with the
    key (this listener answers nothing, so the child is stopped once the request came)."""
    env = isolated_env(tmp_path, listener, key=KEY)
    env.update({"PYTHONPATH": REPO, "WANDB_INIT_TIMEOUT": "60"})
    proc = subprocess.Popen([sys.executable, "-c", ONLINE_CHILD, str(tmp_path / "run")], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not listener.requests and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and wandb's service process it started
        except ProcessLookupError:  # the group is gone already
            pass
        out = proc.communicate()[0].decode(errors="replace")
    assert listener.requests, f"no request reached W&B's address; the child said:\n{out[-3000:]}"
    request = listener.requests[0].decode(errors="replace")
    token = base64.b64encode(f"api:{KEY}".encode()).decode()
    assert request.startswith("POST ") and token in request, request[:500]
    assert "rlx: wandb" not in out  # no offline line
    assert not glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*"))
