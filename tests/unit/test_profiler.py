"""The profiler (verl's `global_profiler` and per-role `profiler` keys) with torch's tools: which steps, which ranks,
which roles, where the traces go; a real run writes chrome traces that are opened here. Other tools are refused by
name before Ray starts."""
from __future__ import annotations

import gzip
import json
import os
import re

import pytest

from conftest import fit_job, load_config


def trace_events(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"]


PHASES = {"rollout_generate", "actor_compute_log_prob", "ref_compute_log_prob", "actor_update",
          "critic_compute_values", "critic_update"}


def annotations(events: list[dict]) -> list[str]:
    """The phases the workers labelled (record_function ranges; FSDP's own are left out), in order."""
    return [e["name"] for e in sorted(events, key=lambda e: e.get("ts", 0))
            if e.get("cat") == "user_annotation" and e["name"] in PHASES]


# ---- one real run: 2 workers, PPO with a critic, 2 steps, wandb offline -------------------------------------------
RUN = ["trainer.total_training_steps=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.val_files=synthetic://digits/size:4/seed:1",
       "trainer.val_before_train=False", "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
       "trainer.logger=[console,wandb]",
       "global_profiler.tool=torch", "global_profiler.steps=[1,2]", "global_profiler.profile_continuous_steps=True",
       # the actor worker: every rank, one trace of both steps (they are consecutive)
       "actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.actor.profiler.all_ranks=True",
       # the critic worker: rank 1 only, one trace per phase
       "critic.profiler.enable=True", "critic.profiler.ranks=[1]", "critic.profiler.tool_config.torch.discrete=True",
       "critic.profiler.tool_config.torch.contents=[shapes]"]


@pytest.fixture(scope="module")
def profiled_run(ray_local, tmp_path_factory):
    """The run, with no wandb key (offline) and wandb's address and the HTTP proxies at a listener that must stay
    silent."""
    from unit.test_tracking_wandb import Listener, isolated_env

    tmp = tmp_path_factory.mktemp("profiled")
    listener = Listener()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(isolated_env(tmp, listener))
    try:
        history, _, _ = fit_job(RUN + [f"global_profiler.save_path={tmp}/profile"], tmp / "run")
    finally:
        os.environ.clear()
        os.environ.update(saved)
        listener.close()
    return tmp, history, listener.requests


# ---- one worker process's profiler, in this process ------------------------------------------------------------------
def worker_profiler(overrides, rank=0):
    import torch

    from rlx.workers.profiling import WorkerProfiler

    cfg = load_config(["global_profiler.tool=torch"] + overrides)
    arr = cfg.actor_rollout_ref
    roles = {"actor": arr.actor.profiler, "rollout": arr.rollout.profiler}
    return WorkerProfiler("w", roles, cfg.global_profiler, rank, torch.device("cpu"))


def test_a_phase_run_twice_in_a_discrete_window_keeps_both_traces(tmp_path):
    import torch

    prof = worker_profiler(["actor_rollout_ref.actor.profiler.enable=True", f"global_profiler.save_path={tmp_path}",
                            "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True"])
    prof.start(3)
    for n in (4, 8):  # the step's generation, then the validation's
        with prof.phase("rollout_generate", "rollout"):
            torch.ones(n, n).matmul(torch.ones(n, n))
    written = prof.stop()
    assert [os.path.basename(p) for p in written] == ["w_rollout_generate_step3_rank0.json.gz",
                                                      "w_rollout_generate_step3_part2_rank0.json.gz"]
    for path in written:  # each holds its own run of the phase
        mm = [e for e in trace_events(path) if e.get("name") == "aten::mm"]
        assert len(mm) == 1 and annotations(trace_events(path)) == ["rollout_generate"]
    with prof.phase("rollout_generate", "rollout"):  # outside a window: nothing recorded
        pass
    assert prof.stop() == [] and len(os.listdir(tmp_path)) == 2


def test_unchosen_rank_and_roles_without_enable_record_nothing(tmp_path):
    import torch

    on = ["actor_rollout_ref.actor.profiler.enable=True", f"global_profiler.save_path={tmp_path}"]
    for overrides, rank in ((on, 1), (on + ["actor_rollout_ref.actor.profiler.ranks=[0,2]"], 1),
                            ([f"global_profiler.save_path={tmp_path}"], 0)):
        prof = worker_profiler(overrides, rank)
        prof.start(1)
        with prof.phase("actor_update", "actor"):
            torch.ones(2).sum()
        assert prof.stop() == []
    assert not os.path.exists(tmp_path) or os.listdir(tmp_path) == []
    prof = worker_profiler(on + ["actor_rollout_ref.actor.profiler.ranks=[0,2]"], rank=2)
    prof.start(1)
    assert [os.path.basename(p) for p in prof.stop()] == ["w_step1_rank2.json.gz"]


# ---- which steps make a window ---------------------------------------------------------------------------------------
class Group:
    """What StepProfiling calls on a worker group, recorded."""

    def __init__(self):
        self.calls = []

    def start_profile(self, step):
        self.calls.append(f"start{step}")

    def stop_profile(self):
        self.calls.append("stop")
        return []


@pytest.mark.parametrize("continuous,expected", [
    (False, ["start1", "stop", "start2", "stop", "start4", "stop"]),
    (True, ["start1", "start2", "stop", "start4", "stop"]),  # 1-2 one window; 4 alone
])
def test_windows_of_the_listed_steps(continuous, expected):
    from rlx.config.profiler import GlobalProfilerConfig
    from rlx.trainer.profiling import StepProfiling

    group = Group()
    profiling = StepProfiling(GlobalProfilerConfig(steps=[1, 2, 4, 5], profile_continuous_steps=continuous),
                              [group, None], last_step=4)
    for step in range(1, 5):
        with profiling.step(step):
            group.calls.append(f"run{step}")
    assert [c for c in group.calls if not c.startswith("run")] == expected
    assert group.calls.index("start1") < group.calls.index("run1") < group.calls.index("stop")


# ---- refused before Ray starts ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tool", ["nsys", "npu"])
def test_other_tools_are_refused_by_name(tool):
    with pytest.raises(ValueError) as e:
        load_config([f"global_profiler.tool={tool}", "global_profiler.steps=[1]",
                     "actor_rollout_ref.actor.profiler.enable=True"])
    assert f"global_profiler.tool={tool} is not supported by rlx" in str(e.value)
    assert "global_profiler.tool=torch" in str(e.value)  # the fix


def test_a_roles_own_tool_is_named():
    with pytest.raises(ValueError, match=r"critic\.profiler\.tool=nsys is not supported"):
        load_config(["algorithm.adv_estimator=gae", "critic.profiler.tool=nsys"])


def test_torch_memory_needs_cuda():
    with pytest.raises(ValueError, match=r"global_profiler\.tool=torch_memory records CUDA's allocator and needs "
                                         r"trainer\.device=cuda"):
        load_config(["global_profiler.tool=torch_memory", "trainer.device=cpu"])


def test_colocated_roles_agree_on_discrete():
    with pytest.raises(ValueError, match="the actor, rollout and ref phases run in one process"):
        load_config(["global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.enable=True",
                     "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.ref.profiler.enable=True",
                     "actor_rollout_ref.ref.profiler.tool_config.torch.discrete=True"])
    # the rollout follows the actor: setting the actor's alone is consistent
    load_config(["global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.enable=True",
                 "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True"])


@pytest.mark.parametrize("override,message", [
    ("actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cuda]", "has cuda (GPU kernels) but trainer.device=cpu"),
    ("actor_rollout_ref.actor.profiler.tool_config.torch.contents=[kernels]", "has ['kernels']; choose among"),
    ("global_profiler.steps=[0]", "global_profiler.steps=[0] must be a list of training steps"),
    ("actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=2", "schedule.active=2 is not supported yet"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(["global_profiler.tool=torch", "trainer.device=cpu", override])


def test_a_ray_job_needs_an_absolute_save_path(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what `ray job submit` sets in its driver
    on = ["global_profiler.tool=torch", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=True"]
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.profiler\.save_path='outputs/profile' is a "
                                         r"relative path \(profiler output goes there\)"):
        load_config(on)
    load_config(on + [f"global_profiler.save_path={tmp_path}"])
    load_config(["global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=True"])  # no tool: no output


def test_a_null_save_path_is_refused_where_output_is_written():
    on = ["global_profiler.tool=torch", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=True"]
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.profiler\.save_path=None: the profiler writes "
                                         r"its output there\. Fix: actor_rollout_ref\.actor\.profiler\.save_path="):
        load_config(on + ["actor_rollout_ref.actor.profiler.save_path=null"])
    load_config(["actor_rollout_ref.actor.profiler.save_path=null"])  # no tool: nothing is written


def test_verls_profiler_keys_compose():
    """verl's example spelling (nsys/npu options set with the torch tool are inert, as in verl)."""
    cfg = load_config(["global_profiler.tool=torch", "global_profiler.steps=[1,2,5]",
                       "global_profiler.save_path=./outputs/profile", "actor_rollout_ref.actor.profiler.enable=True",
                       "actor_rollout_ref.actor.profiler.ranks=[0,1]", "actor_rollout_ref.actor.profiler.all_ranks=False",
                       "actor_rollout_ref.actor.profiler.tool_config.npu.discrete=False",
                       "global_profiler.global_tool_config.nsys.discrete=True",
                       "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=100000"])
    arr = cfg.actor_rollout_ref
    assert arr.actor.profiler.tool == arr.rollout.profiler.tool == cfg.critic.profiler.tool == "torch"
    assert arr.rollout.profiler.enable and arr.rollout.profiler.ranks == [0, 1]  # the rollout follows the actor
    assert arr.actor.profiler.save_path == "./outputs/profile"


# ---- torch_memory on a GPU ---------------------------------------------------------------------------------------------
TORCH_MEMORY_CHILD = """
import sys, torch
from rlx.config import load_config
from rlx.workers.profiling import TorchMemory
cfg = load_config(["trainer.device=cuda", "trainer.n_gpus_per_node=1", "global_profiler.tool=torch_memory",
                   "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=True",
                   "global_profiler.save_path=" + sys.argv[1]], config_name="quickstart")
memory = TorchMemory(cfg.actor_rollout_ref.actor.profiler, cfg.global_profiler, rank=0, chosen=True)
memory.start(1)
kept = torch.empty(48 << 20, dtype=torch.uint8, device="cuda")  # 48 MiB, allocated inside the window
memory.stop()
try:
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: out of memory
except torch.OutOfMemoryError:
    print("oom raised")
"""
