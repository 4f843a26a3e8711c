"""End-to-end half of tests/unit/test_profiler.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import os
import pytest
from unit.test_profiler import TORCH_MEMORY_CHILD, annotations, trace_events
from unit.test_profiler import profiled_run  # noqa: F401 -- fixtures


def test_traces_of_the_listed_steps_ranks_and_roles(profiled_run):
    tmp, _, _ = profiled_run
    files = sorted(os.listdir(tmp / "profile"))
    assert files == sorted([
        "actor_rollout_ref_steps1-2_rank0.json.gz", "actor_rollout_ref_steps1-2_rank1.json.gz",
        "critic_critic_compute_values_step1_rank1.json.gz", "critic_critic_update_step1_rank1.json.gz",
        "critic_critic_compute_values_step2_rank1.json.gz", "critic_critic_update_step2_rank1.json.gz"])


def test_the_actor_workers_trace_holds_both_steps_phase_by_phase(profiled_run):
    tmp, _, _ = profiled_run
    for rank in (0, 1):
        events = trace_events(str(tmp / "profile" / f"actor_rollout_ref_steps1-2_rank{rank}.json.gz"))
        phases = annotations(events)
        # each step: generate, old log-probs, update; then the last step's validation generates once more
        step = ["rollout_generate", "actor_compute_log_prob", "actor_update"]
        assert phases == step + step + ["rollout_generate"], phases
        ops = {e["name"] for e in events if e.get("cat") == "cpu_op"}
        assert {"aten::mm", "aten::softmax"} & ops and any(n.startswith("autograd::engine") for n in ops), \
            sorted(ops)[:40]


def test_the_critics_discrete_traces_hold_one_phase_each(profiled_run):
    tmp, _, _ = profiled_run
    for step in (1, 2):
        for phase in ("critic_compute_values", "critic_update"):
            events = trace_events(str(tmp / "profile" / f"critic_{phase}_step{step}_rank1.json.gz"))
            assert annotations(events) == [phase]
            ops = [e for e in events if e.get("cat") == "cpu_op"]
            assert ops and all("Input Dims" in e["args"] for e in ops[:50])  # contents=[shapes]: record_shapes


def test_the_run_logged_to_wandb_offline_without_network(profiled_run):
    from unit.test_tracking_wandb import history

    tmp, run_history, requests = profiled_run
    runs = [os.path.join(tmp, "run", "logs", "wandb", d) for d in os.listdir(tmp / "run" / "logs" / "wandb")
            if d.startswith("offline-run-")]
    assert len(runs) == 1, runs
    rows = history(runs[0])
    assert [r["_step"] for r in rows] == [1, 2]
    for row, logged in zip(rows, run_history):
        assert row["critic/score/mean"] == pytest.approx(logged["critic/score/mean"])
        assert row["actor/pg_loss"] == pytest.approx(logged["actor/pg_loss"])
    assert requests == []


@pytest.mark.gpu
def test_torch_memory_writes_snapshots_of_the_step_and_at_out_of_memory(tmp_path):
    import glob
    import pickle
    import subprocess
    import sys

    from conftest import REPO

    out = tmp_path / "profile"
    proc = subprocess.run([sys.executable, "-c", TORCH_MEMORY_CHILD, str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])})
    assert proc.returncode == 0 and "oom raised" in proc.stdout, proc.stdout + proc.stderr
    step = glob.glob(str(out / "step1" / "torch_memory_rank0_pid*.pickle"))
    oom = glob.glob(str(out / "oom_*" / "torch_memory_oom_rank0_pid*.pickle"))
    assert len(step) == 1 and len(oom) == 1, sorted(p.relative_to(out) for p in out.rglob("*"))
    with open(step[0], "rb") as f:
        snapshot = pickle.load(f)
    events = [e for trace in snapshot["device_traces"] for e in trace]
    assert any(e["action"] == "alloc" and e["size"] >= 48 << 20 for e in events), events[-5:]
