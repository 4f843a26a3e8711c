"""End-to-end half of tests/unit/test_device_defaults.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import os
import subprocess
import sys
import tempfile
import time
import pytest
from conftest import REPO, load_config  # load_config: the quickstart job's config
from unit.test_device_defaults import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    INIT_RAY,
    _doc_submit_block,
)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_cli_cuda_without_gpu_fails_in_seconds_naming_the_key():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "rlx.trainer.main_ppo", "trainer.device=cuda"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    seconds = time.time() - start
    assert proc.returncode != 0
    assert "trainer.device=cuda" in proc.stderr and "trainer.device=cpu" in proc.stderr, proc.stderr
    assert "Started a local Ray" not in proc.stdout + proc.stderr
    assert seconds < 30, seconds


def test_stale_cluster_file_does_not_redirect_a_local_run():
    """Ray's temp folder names a stopped cluster (what `ray start` leaves behind): a local run starts its own Ray
    at once instead of retrying that address for minutes."""
    tmp = tempfile.mkdtemp(prefix="rlxst", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    stale = "127.0.0.1:1"  # nothing listens there
    os.makedirs(os.path.join(tmp, "ray"))
    with open(os.path.join(tmp, "ray", "ray_current_cluster"), "w") as f:
        f.write(stale)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(RAY_TMPDIR=tmp, RAY_USAGE_STATS_ENABLED="0")
    try:
        # the file is live: Ray's own address discovery (what a bare ray.init() uses) would pick the stale address
        probe = subprocess.run([sys.executable, "-c", "from ray._private import services; "
                                "print(services.canonicalize_bootstrap_address(None))"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert probe.stdout.strip().endswith(":1"), probe.stdout + probe.stderr  # 127.0.0.1 as this host's IP
        start = time.time()
        proc = subprocess.run([sys.executable, "-c", INIT_RAY], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
        seconds = time.time() - start
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert "Started a local Ray instance" in out, out
        gcs = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("GCS ")]
        assert gcs and not gcs[0].endswith(":1"), out
        assert seconds < 90, seconds
    finally:
        subprocess.run(["rm", "-rf", tmp])


def test_cluster_doc_submit_example_is_complete(monkeypatch):
    """docs/ray_cluster.md's `ray job submit` example works as written: the token is exported, every flag exists,
    the runtime env file exists, and its overrides pass rlx's validation as the driver of a job would run it."""
    import shlex

    block = _doc_submit_block()
    assert "..." not in block, block
    assert "export RAY_AUTH_MODE=token" in block and "export RAY_AUTH_TOKEN=" in block, block
    lines = block.replace("\\\n", " ").splitlines()
    command = next(c for c in lines if c.strip().startswith(".venv/bin/ray job submit"))
    argv = shlex.split(command)
    dash = argv.index("--")
    flags = [a for a in argv[3:dash] if a.startswith("--")]
    assert {"--address", "--working-dir", "--runtime-env"} <= set(flags), flags
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    help_text = subprocess.run([ray_cli, "job", "submit", "--help"], capture_output=True, text=True, timeout=120).stdout
    for flag in flags:
        assert flag in help_text, flag
    assert os.path.exists(os.path.join(REPO, argv[argv.index("--runtime-env") + 1]))
    # the venv's python by its absolute path on the nodes (a bare `python` there lacks rlx's dependencies)
    assert argv[dash + 1:dash + 4] == ["$PWD/.venv/bin/python", "-m", "rlx.trainer.main_ppo"], argv
    overrides = argv[dash + 4:]
    # as the job's driver sees it: RAY_ADDRESS set by the job supervisor, inside a Ray job
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    cfg = load_config(overrides)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.device) == (2, 8, "cuda")
    assert os.path.isabs(cfg.trainer.default_local_dir)
