"""GPU defaults resolved at config load (trainer.device=auto, mixed precision), device errors before Ray starts,
where a local run's Ray comes from, and output paths of `ray job submit` jobs."""
import os
import subprocess
import sys
import tempfile
import time

import pytest

from rlx.config.device import resolve_device
from rlx.config.loader import compose, to_typed

from conftest import REPO, load_config  # load_config: the quickstart job's config

FSDP_KEYS = ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.model.fsdp_config")


def _resolved(overrides, gpus: int):
    return resolve_device(to_typed(compose(overrides, config_name="quickstart")), gpu_count=lambda: gpus)


def _mp(cfg, prefix):
    obj = cfg
    for part in prefix.split("."):
        obj = getattr(obj, part)
    return obj.mixed_precision


def test_auto_is_cuda_with_verl_mixed_precision_where_a_gpu_is_seen():
    cfg = _resolved([], gpus=1)
    assert cfg.trainer.device == "cuda"
    for prefix in FSDP_KEYS:
        assert _mp(cfg, prefix) == {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}, prefix
    assert cfg.actor_rollout_ref.actor.fsdp_config.model_dtype == "fp32"  # fp32 master weights


def test_auto_is_cpu_in_fp32_without_a_gpu():
    cfg = _resolved([], gpus=0)
    assert cfg.trainer.device == "cpu"
    for prefix in FSDP_KEYS:
        assert _mp(cfg, prefix) == {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}, prefix


def test_explicit_settings_win():
    cfg = _resolved(["trainer.device=cpu", "critic.model.fsdp_config.mixed_precision.param_dtype=bf16"], gpus=2)
    assert cfg.trainer.device == "cpu"
    assert _mp(cfg, "critic.model.fsdp_config") == {"param_dtype": "bf16", "reduce_dtype": "fp32",
                                                    "buffer_dtype": "fp32"}
    cfg = _resolved(["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32"], gpus=1)
    assert _mp(cfg, "actor_rollout_ref.actor.fsdp_config")["param_dtype"] == "fp32"
    assert _mp(cfg, "actor_rollout_ref.ref.fsdp_config")["param_dtype"] == "bf16"


def test_load_config_resolves_auto_on_this_machine():
    import torch

    cfg = load_config([])
    assert cfg.trainer.device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_bad_mixed_precision_dtype_names_the_key():
    with pytest.raises(ValueError, match=r"critic.model.fsdp_config.mixed_precision.param_dtype='bf8'"):
        load_config(["critic.model.fsdp_config.mixed_precision.param_dtype=bf8"])


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


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_on_a_cluster_is_checked_against_the_cluster_not_this_machine(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = load_config(["trainer.device=cuda", "ray_init.address=10.0.0.1:6379"])  # no local GPU: not an error
    assert cfg.trainer.device == "cuda"


def test_relative_outputs_of_a_ray_job_are_a_config_error(monkeypatch):
    """A Ray job's working dir is a temporary copy: a relative path is refused when the job writes there."""
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what the job supervisor sets for the driver
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    relative = r"trainer.default_local_dir='checkpoints/rlx/default' is a relative path"
    for writer, why in (("trainer.save_freq=1", "checkpoints"), ("trainer.logger=[console,file]", "file logger"),
                        ("trainer.logger=[console,tensorboard]", "tensorboard event files")):
        with pytest.raises(ValueError, match=relative) as e:
            load_config(["trainer.device=cpu", writer])
        assert why in str(e.value), (writer, str(e.value))
    with pytest.raises(ValueError, match=r"ray_init.timeline_json_file='timeline.json' is a relative path"):
        load_config(["trainer.device=cpu", "ray_init.timeline_json_file=timeline.json"])
    monkeypatch.setenv("TENSORBOARD_DIR", "tb")
    with pytest.raises(ValueError, match=r"TENSORBOARD_DIR"):
        load_config(["trainer.device=cpu", "trainer.default_local_dir=/abs/out",
                     "trainer.logger=[console,tensorboard]"])
    # tensorboard writes to an absolute TENSORBOARD_DIR: nothing goes to the relative default_local_dir
    monkeypatch.setenv("TENSORBOARD_DIR", "/abs/tb")
    assert load_config(["trainer.device=cpu", "trainer.logger=[console,tensorboard]"]).trainer.default_local_dir \
        == "checkpoints/rlx/default"
    assert load_config(["trainer.device=cpu", "trainer.default_local_dir=/abs/out", "trainer.save_freq=1",
                        "trainer.logger=[console,file]"]).trainer.default_local_dir == "/abs/out"


def test_ray_job_writing_nothing_locally_runs_with_the_default_relative_dir(monkeypatch):
    """`ray job submit -- python -m rlx.trainer.main_ppo trainer.total_training_steps=1`: no checkpoint, console
    logger only, so the relative default trainer.default_local_dir is never written and not refused; a relative
    TENSORBOARD_DIR without the tensorboard logger is never read either."""
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.setenv("TENSORBOARD_DIR", "tb")
    cfg = load_config(["trainer.device=cpu", "trainer.total_training_steps=1"])
    assert cfg.trainer.default_local_dir == "checkpoints/rlx/default" and cfg.trainer.save_freq <= 0
    assert cfg.trainer.logger == ["console"]


def test_relative_outputs_outside_a_ray_job_are_fine(monkeypatch):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert load_config(["trainer.device=cpu"]).trainer.default_local_dir == "checkpoints/rlx/default"


INIT_RAY = """
import ray
from rlx.config import load_config
from rlx.plan import make_plan
from rlx.trainer.launch import init_ray
cfg = load_config(["trainer.device=cpu", "ray_init.num_cpus=1"], config_name="quickstart")
init_ray(cfg, make_plan(cfg))
print("GCS", ray.get_runtime_context().gcs_address, flush=True)
ray.shutdown()
"""


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


def _doc_submit_block() -> str:
    with open(os.path.join(REPO, "docs", "ray_cluster.md")) as f:
        text = f.read()
    section = text[text.index("## 3. Submit a job"):]
    return section[section.index("```bash") + len("```bash"):section.index("```", section.index("```bash") + 7)]


def test_cluster_doc_submit_example_is_complete(monkeypatch):
    """docs/ray_cluster.md's `ray job submit` example works as written: the token is exported, every flag exists,
    the runtime env file exists, and its overrides pass rlx's validation as the driver of a job would run it."""
    import shlex

    block = _doc_submit_block()
    assert "..." not in block, block
    assert "export RAY_AUTH_MODE=token" in block and "export RAY_AUTH_TOKEN=" in block, block
    command = next(c for c in block.replace("\\\n", " ").splitlines() if c.strip().startswith("ray job submit"))
    argv = shlex.split(command)
    dash = argv.index("--")
    flags = [a for a in argv[3:dash] if a.startswith("--")]
    assert {"--address", "--working-dir", "--runtime-env"} <= set(flags), flags
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    help_text = subprocess.run([ray_cli, "job", "submit", "--help"], capture_output=True, text=True, timeout=120).stdout
    for flag in flags:
        assert flag in help_text, flag
    assert os.path.exists(os.path.join(REPO, argv[argv.index("--runtime-env") + 1]))
    assert argv[dash + 1:dash + 4] == ["python", "-m", "rlx.trainer.main_ppo"], argv
    overrides = argv[dash + 4:]
    # as the job's driver sees it: RAY_ADDRESS set by the job supervisor, inside a Ray job
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    cfg = load_config(overrides)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.device) == (2, 8, "cuda")
    assert os.path.isabs(cfg.trainer.default_local_dir)


def test_auto_falling_back_to_more_cpu_workers_than_cores_is_a_note(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def notes_for(overrides, gpus, cores):
        notes = []
        resolve_device(to_typed(compose(overrides, config_name="quickstart")), gpu_count=lambda: gpus, notes=notes,
                       cpu_count=lambda: cores)
        return notes

    eight = ["trainer.n_gpus_per_node=8"]
    (note,) = notes_for(eight, gpus=0, cores=2)
    assert note.startswith("rlx: note: trainer.device=auto found no GPU here, so each role runs 8 CPU worker "
                           "processes (trainer.nnodes=1 x trainer.n_gpus_per_node=8) on this machine's 2 CPU core(s)")
    assert notes_for(eight, gpus=0, cores=16) == []  # enough cores: nothing to say
    assert notes_for(eight, gpus=8, cores=2) == []  # cuda
    assert notes_for(eight + ["trainer.device=cpu"], gpus=0, cores=2) == []  # asked for: not a surprise


def test_check_says_the_device_and_the_gpus_wanted_against_present(monkeypatch):
    from rlx.trainer import check

    monkeypatch.setattr("rlx.config.device.visible_gpu_count", lambda: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = load_config(["trainer.device=cpu", "trainer.n_gpus_per_node=4",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=4"])
    assert check.devices(cfg).startswith("cpu: 4 CPU worker process(es) per role on this machine (")
    assert check.devices(cfg).endswith("GPUs visible here: 0")
    cfg.trainer.device = "cuda"
    assert check.devices(cfg).startswith("cuda: 4 GPU(s) wanted (trainer.nnodes x trainer.n_gpus_per_node), 0 visible "
                                         "here")
