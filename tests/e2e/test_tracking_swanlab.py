"""End-to-end half of tests/unit/test_tracking_swanlab.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import glob
import os
import subprocess
import sys
import time
import yaml
from conftest import REPO, load_config
from unit.test_tracking_wandb import apply_env
from unit.test_tracking_swanlab import KEY, ONLINE_CHILD, isolated_env, needs_swanlab, offline_run_dir, records
from unit.test_tracking_swanlab import listener  # noqa: F401 -- fixtures


@needs_swanlab
def test_no_key_logs_offline_into_the_runs_folder(tmp_path, monkeypatch, capfd, listener):
    from rlx.trainer.tracking import Tracker, swanlab_has_credentials

    apply_env(monkeypatch, isolated_env(tmp_path, listener))
    assert not swanlab_has_credentials()
    out = tmp_path / "run"
    cfg = load_config(["trainer.logger=[console,swanlab]", f"trainer.default_local_dir={out}",
                       "trainer.project_name=proj", "trainer.experiment_name=exp1"])
    log_dir = str(out / "logs")
    tracker = Tracker(cfg, log_dir)
    logged = [{"critic/score/mean": 0.25 * step, "actor/pg_loss": -1.5 + step} for step in (1, 2, 3)]
    for step, metrics in enumerate(logged, start=1):
        tracker.log(metrics, step=step)
    tracker.log_generations([("1+1=", "2", 1.0)], step=3)
    tracker.close()
    run_dir = offline_run_dir(capfd.readouterr().err, log_dir)  # under <default_local_dir>/logs
    recs = records(run_dir)
    kinds = [r.WhichOneof("record_type") for r in recs]
    scalars = {(r.scalar.key, r.scalar.step): r.scalar.value.number for r, kind in zip(recs, kinds) if kind == "scalar"}
    assert scalars == {(k, step): v for step, m in enumerate(logged, start=1) for k, v in m.items()}
    start = next(r.start for r in recs if r.WhichOneof("record_type") == "start")
    assert (start.project, start.name) == ("proj", "exp1")  # trainer.project_name / experiment_name, as verl
    assert kinds[-1] == "finish"
    assert glob.glob(os.path.join(run_dir, "media", "echarts", "*.json"))  # the validation table
    config = yaml.safe_load(open(os.path.join(run_dir, "files", "config.yaml")))
    flat = yaml.safe_dump(config)
    assert "exp1" in flat and "swanlab" in flat, flat[:500]
    assert listener.requests == []  # nothing reached swanlab's address or a proxy


@needs_swanlab
def test_swanlab_log_dir_names_the_folder(tmp_path, monkeypatch, capfd, listener):
    from rlx.trainer.tracking import Tracker

    apply_env(monkeypatch, isolated_env(tmp_path, listener))
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(tmp_path / "elsewhere"))
    cfg = load_config(["trainer.logger=[swanlab]", f"trainer.default_local_dir={tmp_path / 'run'}"])
    tracker = Tracker(cfg, str(tmp_path / "run" / "logs"))
    tracker.log({"x": 1.0}, step=1)
    tracker.close()
    run_dir = offline_run_dir(capfd.readouterr().err, str(tmp_path / "elsewhere"))
    assert [(r.scalar.key, r.scalar.value.number) for r in records(run_dir) if r.WhichOneof("record_type") == "scalar"] \
        == [("x", 1.0)]
    assert not os.path.exists(tmp_path / "run" / "logs")
    assert listener.requests == []


@needs_swanlab
def test_with_a_key_it_logs_online(tmp_path, listener):
    """With SWANLAB_API_KEY the run goes online: its first request reaches swanlab's address, carrying the key (this
    listener answers nothing, so the login fails and the child exits)."""
    env = isolated_env(tmp_path, listener, key=KEY)
    env["PYTHONPATH"] = REPO
    proc = subprocess.run([sys.executable, "-c", ONLINE_CHILD, str(tmp_path / "run")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    deadline = time.monotonic() + 10
    while not listener.requests and time.monotonic() < deadline:
        time.sleep(0.1)
    assert listener.requests, f"no request reached swanlab's address; the child said:\n{out[-3000:]}"
    request = listener.requests[0].decode(errors="replace")
    assert request.startswith("POST ") and KEY in request, request[:500]
    assert "rlx: swanlab" not in out  # no offline line
    assert proc.returncode != 0 and "AuthenticationError" in out, out[-3000:]  # online: the login had no answer
