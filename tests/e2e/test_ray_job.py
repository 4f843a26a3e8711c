"""A real Ray cluster: start a head node (and a second node), `ray job submit` a 1-step tiny rlx job to it, check
that the job's driver joined that cluster (and did not start a local Ray of its own), logged the step metrics,
placed its ranks on both nodes, wrote its outputs where asked, and that relative output paths are refused.

Everything runs in subprocesses with their own environment (no RAY_ADDRESS and no `ray.init` in the pytest
process), a private temp dir and free ports, so the session's in-process Ray (conftest `ray_local`) and other Ray
instances on the machine are left alone. Each node is stopped by signalling the `ray start --block` process it was
started from (it tears down its own processes), then its process group -- never with `ray stop`, which stops every
Ray process of the machine.
"""
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
import yaml

from conftest import REPO

RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")  # the CLI of the environment running the tests
if not os.path.exists(RAY_CLI):
    RAY_CLI = shutil.which("ray") or RAY_CLI
pytestmark = pytest.mark.slow
JOB_TIMEOUT_S = 300
JOB_ARGS = [
    "--config-name", "quickstart", "trainer.total_training_steps=1", "actor_rollout_ref.rollout.name=hf",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "trainer.val_before_train=False", "data.val_files=synthetic://digits/size:8/seed:1",
]


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _cluster_env(tmp: str) -> dict:
    """Environment of every Ray CLI call (and, through the node, of the job): token auth with a private token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH_", "RAY_JOB_"))}
    env.update({
        # Ray 2.60 turns token auth on for a new cluster when ~/.ray/auth_token exists; make it explicit and use
        # a token of this test only, so neither the user's token file nor other clusters matter.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
        # keep the node's own processes lean: two shared cores
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TMPDIR": tmp,
    })
    return env


def _ray(env, *args, timeout=120, check=True) -> str:
    """Run the Ray CLI; returns its stdout without colour codes."""
    proc = subprocess.run([RAY_CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"`ray {' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)


def _start_node(args: list[str], env: dict, log_path: str) -> subprocess.Popen:
    """`ray start --block <args>`, returned once the node is up (its own process group, so it can be torn down)."""
    with open(log_path, "w") as log:
        node = subprocess.Popen([RAY_CLI, "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                                 *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 120
    while True:
        with open(log_path) as f:
            text = f.read()
        if "Ray runtime started" in text:
            return node
        if node.poll() is not None or time.time() > deadline:
            _stop_node(node)
            raise AssertionError(f"the Ray node did not start:\n{text}")
        time.sleep(0.5)


def _stop_node(node: subprocess.Popen) -> None:
    if node.poll() is None:
        node.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            node.wait(timeout=45)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(node.pid, signal.SIGKILL)  # anything left in the node's own process group
    except ProcessLookupError:
        pass
    node.wait()


@contextlib.contextmanager
def _cluster(cpus_per_node: list[int]):
    """A Ray cluster on 127.0.0.1: a head node with its dashboard (job API) and one more node per further entry,
    each advertising that many CPUs; yields (dashboard address, gcs address, env, temp dir)."""
    tmp = tempfile.mkdtemp(prefix="rlxrj", dir="/tmp")  # short: Ray's unix socket paths must stay < 108 chars
    env = _cluster_env(tmp)
    gcs, dash, client, agent, *agents = _free_ports(4 + len(cpus_per_node) - 1)
    nodes = []
    try:
        nodes.append(_start_node(
            ["--head", f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
             "--include-dashboard=true", f"--ray-client-server-port={client}",
             f"--dashboard-agent-listen-port={agent}", f"--temp-dir={tmp}", f"--num-cpus={cpus_per_node[0]}"],
            env, os.path.join(tmp, "ray_start_head.log")))
        for i, (cpus, port) in enumerate(zip(cpus_per_node[1:], agents)):
            # a temp dir of its own: nodes sharing one would unpack the job's working dir into the same folder,
            # under the feet of the driver importing from it
            node_tmp = os.path.join(tmp, f"n{i + 1}")
            os.makedirs(node_tmp)
            nodes.append(_start_node(
                [f"--address=127.0.0.1:{gcs}", f"--dashboard-agent-listen-port={port}", f"--temp-dir={node_tmp}",
                 f"--num-cpus={cpus}"], env, os.path.join(tmp, f"ray_start_node{i + 1}.log")))
        address = f"http://127.0.0.1:{dash}"
        # the job API comes up with the dashboard, possibly just after the node (plain HTTP: no CLI start-up cost)
        request = urllib.request.Request(f"{address}/api/version",
                                         headers={"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"})
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise AssertionError(f"the dashboard at {address} does not answer")
            time.sleep(1)
        yield address, f"127.0.0.1:{gcs}", env, tmp
    finally:
        for node in reversed(nodes):  # worker nodes first, then the head
            _stop_node(node)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def ray_head():
    """A one-node cluster (2 CPUs): yields (dashboard address, gcs address, env, temp dir)."""
    with _cluster([2]) as cluster:
        yield cluster


@pytest.fixture
def ray_two_nodes():
    """A head node and a second node, one CPU worker slot each."""
    with _cluster([1, 1]) as cluster:
        yield cluster


def _runtime_env() -> dict:
    """scripts/runtime_env.yaml (what users submit with), as the JSON of `--runtime-env-json`; whatever git ignores
    in this checkout (local build folders) is not uploaded either."""
    with open(os.path.join(REPO, "scripts", "runtime_env.yaml")) as f:
        runtime_env = yaml.safe_load(f)
    assert {".venv/", ".git/"} <= set(runtime_env["excludes"])
    ignored = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory"],
                             cwd=REPO, capture_output=True, text=True).stdout.split()
    runtime_env["excludes"] += ["/" + p for p in ignored if p.endswith("/")]
    runtime_env["env_vars"].update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return runtime_env


def _submit(address: str, env: dict, args: list[str]) -> tuple[bool, str, float]:
    """`ray job submit` a tiny rlx run with the repository as working dir; returns (succeeded, logs, seconds)."""
    job_id = f"rlx-test-{secrets.token_hex(4)}"
    start = time.time()
    _ray(env, "job", "submit", f"--address={address}", f"--submission-id={job_id}", f"--working-dir={REPO}",
         f"--runtime-env-json={json.dumps(_runtime_env())}", "--no-wait",
         "--", sys.executable, "-m", "rlx.trainer.main_ppo", *args)
    try:
        # --follow streams the job's logs and returns when the job reaches a terminal state
        logs = _ray(env, "job", "logs", f"--address={address}", "--follow", job_id, timeout=JOB_TIMEOUT_S,
                    check=False)
    except subprocess.TimeoutExpired:
        _ray(env, "job", "stop", f"--address={address}", job_id, check=False)
        raise
    status = _ray(env, "job", "status", f"--address={address}", job_id)
    # `ray job status` ends with "Job '<id>' succeeded" (or "... failed" and the status message)
    return f"Job '{job_id}' succeeded" in status, f"{status}\n--- job logs ---\n{logs}", time.time() - start


def _assert_joined(logs: str, gcs_address: str) -> None:
    # the driver joined the head node's cluster through RAY_ADDRESS (set by the job supervisor to the GCS address,
    # under the node's routable IP) ...
    gcs_port = gcs_address.rpartition(":")[2]
    assert re.search(rf"Connecting to existing Ray cluster at address: \S+:{gcs_port}\b", logs), logs
    # ... and never started a Ray of its own
    assert "Started a local Ray instance" not in logs, logs


def _rank_nodes(logs: str, role: str) -> list[str]:
    """Node (id prefix) of each rank of `role`, from the worker group's placement log line."""
    m = re.search(rf"{role}: \d+ ranks, rendezvous \S+, rank -> \(bundle, node\): (.*)", logs)
    assert m, logs
    return re.findall(r"\d+->\(\d+, (\w+)\)", m.group(1))


def test_ray_job_submit_joins_the_cluster(ray_head):
    address, gcs_address, env, tmp = ray_head
    # relative output paths would land in Ray's temporary copy of the working dir: refused at config time when the
    # job writes there (here: tensorboard event files) ...
    ok, logs, seconds = _submit(address, env, JOB_ARGS + ["trainer.logger=[console,tensorboard]"])
    assert not ok and "trainer.default_local_dir='checkpoints/rlx/default' is a relative path" in logs, logs
    assert seconds < 60 and "Started a local Ray" not in logs
    # ... while the same job writing nothing there runs with the relative default: see
    # test_device_defaults.test_ray_job_writing_nothing_locally_runs_with_the_default_relative_dir
    out = os.path.join(tmp, "out")
    ok, logs, seconds = _submit(address, env, JOB_ARGS + [f"trainer.default_local_dir={out}",
                                                          "trainer.logger=[console,tensorboard]"])
    assert ok, f"the job did not succeed:\n{logs}"
    assert "step:1" in logs and "critic/score/mean" in logs, logs
    _assert_joined(logs, gcs_address)
    assert os.listdir(os.path.join(out, "logs", "tensorboard")), "the job's tensorboard logs are not where asked"
    print(f"ray job: {seconds:.1f}s")


def test_ray_job_on_two_nodes(ray_two_nodes):
    """trainer.nnodes=2 x n_gpus_per_node=1 (CPU worker slots) on a 2-node cluster: one rank of each role per node,
    checkpoint written to the absolute default_local_dir."""
    address, gcs_address, env, tmp = ray_two_nodes
    out = os.path.join(tmp, "out")
    ok, logs, seconds = _submit(address, env, JOB_ARGS + [
        "trainer.device=cpu", "trainer.nnodes=2", "trainer.n_gpus_per_node=1", f"trainer.default_local_dir={out}",
        "trainer.save_freq=1"])
    assert ok, f"the job did not succeed:\n{logs}"
    assert "step:1" in logs, logs
    _assert_joined(logs, gcs_address)
    nodes = _rank_nodes(logs, "ActorRolloutRefWorker")
    assert len(nodes) == 2 and nodes[0] != nodes[1], nodes  # the two ranks on the two nodes
    assert os.path.exists(os.path.join(out, "global_step_1", "actor")), os.listdir(out)
    print(f"ray job on 2 nodes: {seconds:.1f}s")
