import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = "quickstart"


def load_config(overrides=None, config_dir=None, config_name: str = QUICKSTART, validate: bool = True):
    """`rlx.config.load_config` on the quickstart job's config (`--config-name quickstart`: the tiny model, the
    synthetic task, GRPO with n=4, 2 workers), the small job most tests start from and override. Tests of the base
    config (verl's defaults) call `rlx.config.load_config` itself."""
    from rlx.config import load_config as load

    return load(overrides, config_dir, config_name, validate)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance shared by every end-to-end test of the session."""
    import ray

    if not ray.is_initialized():
        # a private Ray (never a cluster named in Ray's temp folder); workers get their env from WorkerGroup
        ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_path():
    from rlx.models import resolve_model_path

    return resolve_model_path("builtin://tiny-qwen2")
