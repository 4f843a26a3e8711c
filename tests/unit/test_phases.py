"""The per-step phase view (`python -m rlx.trainer.phases`) on metrics shaped as a CUDA run logs them (the CPU run's
view is checked on a real run in test_e2e.test_grpo_fsdp2_vllm_rollout_with_offload)."""
import json

from rlx.trainer import phases

STEP = {"step": 1, "timing_s/gen": 3.0, "timing_s/rollout/wake": 0.25, "timing_s/rollout/sync": 0.5,
        "timing_s/rollout/generate": 2.0, "timing_s/rollout/sleep": 0.125, "timing_s/reward": 0.5,
        "timing_s/old_log_prob": 1.0, "timing_s/adv": 0.0, "timing_s/update_actor": 4.0, "timing_s/step": 9.0,
        "timing_s/testing": 2.5, "perf/rollout/generated_tokens_per_s": 12345.6,
        "perf/gpu_memory_gib/after_sync": 30.5, "perf/gpu_memory_gib/after_wake": 41.0,
        "perf/gpu_memory_gib/after_generate": 41.25, "perf/gpu_memory_gib/after_sleep": 2.75,
        "perf/gpu_memory_gib/after_update_actor": 12.0, "perf/gpu_memory_gib/total": 79.1}


def test_view(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"step": 0, "val/x/reward/mean": 0.1}, STEP,
                                                      {**STEP, "step": 2}]) + "\n")
    assert phases.main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    header, row = out[1].split(), dict(zip(out[1].split(), out[2].split()))
    assert header[:6] == ["step", "gen:wake", "gen:sync", "gen:generate", "gen:sleep", "gen"]
    assert "ref" not in header  # no KL term: no ref phase
    assert row == {"step": "1", "gen:wake": "0.25", "gen:sync": "0.50", "gen:generate": "2.00", "gen:sleep": "0.12",
                   "gen": "3.00", "reward": "0.50", "old_log_prob": "1.00", "adv": "0.00", "update_actor": "4.00",
                   "testing": "2.50", "other": "0.50", "step_s": "9.00", "gen_tok/s": "12346"}
    assert out[3].split()[0] == "2" and len(out) == 9
    assert "of 79.1" in out[5]
    mem = dict(zip(out[6].split(), out[7].split()))
    assert mem == {"step": "1", "sync": "30.50", "wake": "41.00", "generate": "41.25", "sleep": "2.75",
                   "update_actor": "12.00"}


def test_missing_file_and_no_steps(tmp_path, capsys):
    assert phases.main([str(tmp_path / "nope.jsonl")]) == 2
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0, "val/x/reward/mean": 0.1}) + "\n")
    assert phases.main([str(path)]) == 0
    assert "no training steps" in capsys.readouterr().out


def test_worker_phase_measurement_on_cuda_and_cpu(monkeypatch):
    """`Worker.measured`: seconds summed over repeats of a phase; on CUDA also the device's memory in use after it
    (total - free, what the phase view shows), read after the phase's kernels finished."""
    import torch

    from rlx.workers.base_worker import Worker

    GiB = 2**30
    free = [70 * GiB]
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (free[0], 80 * GiB))
    w = Worker.__new__(Worker)
    w.device = torch.device("cuda")
    m = {}
    with w.measured("wake", m, "rollout/wake"):
        free[0] = 40 * GiB  # the engine's weights and cache came back
    with w.measured("wake", m, "rollout/wake"):
        pass
    with w.measured("update_actor", m):
        free[0] = 60 * GiB
    assert calls == ["sync"] * 3
    assert set(m) == {"timing_s/rollout/wake", "perf/gpu_memory_gib/after_wake", "perf/gpu_memory_gib/total",
                      "perf/gpu_memory_gib/after_update_actor"}
    assert m["perf/gpu_memory_gib/after_wake"] == 40 and m["perf/gpu_memory_gib/after_update_actor"] == 20
    assert m["perf/gpu_memory_gib/total"] == 80 and m["timing_s/rollout/wake"] >= 0
    w.device = torch.device("cpu")
    cpu = {}
    with w.measured("generate", cpu, "rollout/generate"):
        pass
    with w.measured("old_log_prob", cpu):
        pass
    assert list(cpu) == ["timing_s/rollout/generate"] and calls == ["sync"] * 3


def test_launch_timing_is_logged_once_and_shown(tmp_path, capsys):
    """`LaunchTiming`: phases summed when repeated, the total the process's age when the first step starts, all of
    it on the first step only; the phase view prints the split of each run that logged one."""
    import time

    launch = phases.LaunchTiming()
    with launch.phase("workers"):
        time.sleep(0.01)
    launch.add("workers", 1.0)
    launch.add("ray_init", 2.0)
    launch.first_step_starts()
    age = phases.process_age_s()
    first = launch.metrics()
    assert set(first) == {"timing_s/launch/workers", "timing_s/launch/ray_init", "timing_s/launch/total"}
    assert 1.01 <= first["timing_s/launch/workers"] < 2.0 and first["timing_s/launch/ray_init"] == 2.0
    assert 0 < first["timing_s/launch/total"] <= age  # the process's age, taken when the first step started
    assert launch.metrics() == {}  # logged once
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{**STEP, **first}, {**STEP, "step": 2}]) + "\n")
    assert phases.main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("seconds from the process's start to its first step (rollout_engine: part of init_actor when "
                   "colocated)")
    assert out[at + 1].split() == ["step", "ray_init", "workers", "total"]
    assert out[at + 2].split() == ["1", "2.0", f"{first['timing_s/launch/workers']:.1f}",
                                   f"{first['timing_s/launch/total']:.1f}"]
    assert len(out) == at + 3  # only the step that logged it
