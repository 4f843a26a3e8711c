"""GPU defaults resolved at config load (trainer.device=auto, mixed precision), device errors before Ray starts,
where a local run's Ray comes from, and output paths of `ray job submit` jobs."""
import os

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


def _doc_submit_block() -> str:
    with open(os.path.join(REPO, "docs", "ray_cluster.md")) as f:
        text = f.read()
    section = text[text.index("## 3. Submit a job"):]
    return section[section.index("```bash") + len("```bash"):section.index("```", section.index("```bash") + 7)]


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
