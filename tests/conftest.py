import contextlib
import os
import socket

import pytest

from isolation import each_module_isolated, each_test_isolated, track_env_writers  # noqa: F401 (autouse fixtures)

track_env_writers()  # before any test module is imported: who sets what in os.environ (tests/isolation.py)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

pytest_plugins = ["markers"]  # the e2e marker (tests/markers.py): make test-fast runs the tests without it

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = "quickstart"


def example(script: str) -> str:
    """The path of a recipe of examples/ by its file name (`run_grpo_gsm8k.sh`), whichever algorithm folder holds it."""
    import glob

    found = glob.glob(os.path.join(REPO, "examples", "*", script))
    assert len(found) == 1, f"{script}: {len(found)} recipes of that name under examples/ ({found})"
    return found[0]


def load_config(overrides=None, config_dir=None, config_name: str = QUICKSTART, validate: bool = True):
    """`rlx.config.load_config` on the quickstart job's config (`--config-name quickstart`: the tiny model, the
    synthetic task, GRPO with n=4, 2 workers), the small job most tests start from and override. Tests of the base
    config (verl's defaults) call `rlx.config.load_config` itself."""
    from rlx.config import load_config as load

    return load(overrides, config_dir, config_name, validate)


def refusal(overrides, config_name: str = QUICKSTART) -> str:
    """What the checks before any worker starts say about `overrides` on `config_name`: validation's rules and the
    preflight's rules that read the machine (rlx.trainer.probes: model files, packages, GPUs), one problem a line.
    Fails the test when they accept the command line."""
    from rlx.config import load_config as load
    from rlx.config.validate import config_errors
    from rlx.trainer.probes import machine_problems

    cfg = load(list(overrides), None, config_name, validate=False)
    problems = config_errors(cfg) + machine_problems(cfg)
    assert problems, f"{overrides} was accepted"
    return "\n  - ".join(problems)


def fit_job(overrides, tmp_path, config_name: str = QUICKSTART):
    """Build `config_name` with `overrides` (checkpoints and logs under tmp_path), start its Ray worker groups, run
    `fit()`, shut down: (the per-step metrics, the parameter checksum before, after)."""
    from rlx.plan import make_plan
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    cfg = load_config(list(overrides) + [f"trainer.default_local_dir={tmp_path}"], config_name=config_name)
    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    trainer.init_workers()
    before = trainer.param_checksum()
    history = trainer.fit()
    after = trainer.param_checksum()
    trainer.shutdown()
    return history, before, after


def free_port() -> int:
    """A TCP port free on this host now (for a gloo/NCCL rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def one_rank_group(device: str):
    """This process as the only rank of the default process group (NCCL on cuda, gloo on cpu), through rlx's own
    `init_distributed`; at exit the group is destroyed and the rendezvous variables it set are put back."""
    import torch

    from rlx.engine.fsdp import init_distributed

    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    own = not torch.distributed.is_initialized()
    try:
        yield init_distributed(device, rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port())
    finally:
        if own and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _crash_log(root: str, rank: int) -> str:
    return os.path.join(root, f".faulthandler_rank{rank}.log")


def _gloo_per_strategy(rank: int, world: int, port: int, root: str, check) -> None:
    import faulthandler

    import torch

    # a rank that crashes in native code writes the Python stack of each of its threads here (the failure shows it)
    os.makedirs(root, exist_ok=True)
    faulthandler.enable(file=open(_crash_log(root, rank), "w"), all_threads=True)

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    try:
        for strategy in ("fsdp", "fsdp2"):
            try:
                check(rank, strategy, os.path.join(root, strategy))
            except Exception as e:
                raise AssertionError(f"[strategy={strategy} rank={rank}] {type(e).__name__}: {e}") from e
    finally:
        from ranks import end_rank

        end_rank()  # passed: a barrier, the group destroyed, the process gone (tests/ranks.py)


def spawn_per_strategy(check, root: str, world: int = 2) -> None:
    """`check(rank, strategy, root/strategy)` for FSDP1 then FSDP2 in the same `world` CPU processes over gloo
    (spawning and importing transformers dominate on CPU); a failure names the strategy and the rank."""
    import torch

    try:
        torch.multiprocessing.spawn(_gloo_per_strategy, args=(world, free_port(), root, check), nprocs=world,
                                    join=True)
    except torch.multiprocessing.ProcessExitedException as e:
        # a rank killed by a signal fails the test, with the Python stacks of its threads at the crash
        how = e.signal_name or f"exit code {e.exit_code}"
        raise AssertionError(f"rank {e.error_index} died ({how}); its stacks (faulthandler):\n"
                             f"{_read_crash_log(root, e.error_index)}") from e


def _read_crash_log(root: str, rank: int) -> str:
    try:
        with open(_crash_log(root, rank)) as f:
            return f.read().strip() or "(empty)"
    except OSError as e:
        return f"(unreadable: {e})"


def pytest_addoption(parser):
    parser.addoption("--gpu-group", type=int, default=None, metavar="K",
                     help="run only group K of the GPU suite and print its table (tests/gpu_groups.py; "
                          "tests/gpu/gpu_suite.sh)")


def pytest_configure(config):
    if config.getoption("--gpu-group") is not None:
        from gpu_groups import GroupRun

        config.pluginmanager.register(GroupRun(config.getoption("--gpu-group")), "rlx_gpu_group")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_local(request):
    """One local Ray instance shared by every end-to-end test of the session (the only Ray a test may leave up:
    tests/isolation.py checks that each test's actors and placement groups are gone from it)."""
    import ray

    if not ray.is_initialized():
        # a private Ray (never a cluster named in Ray's temp folder); workers get their env from WorkerGroup
        ray.init(address="local", num_cpus=2, include_dashboard=False)
    request.session.rlx_shared_ray = True
    yield ray
    request.session.rlx_shared_ray = False
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_path():
    from rlx.models import resolve_model_path

    return resolve_model_path("builtin://tiny-qwen2")
