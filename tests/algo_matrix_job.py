"""Several short training runs through the entry point (`main_ppo.main`) in one process: the worker groups live in
this process (tests/key_recording.py's in-process groups, world size 1 over gloo, real FSDP engines and the HF
rollout), so a run costs its two steps, not a Ray start and worker spawns.

    python tests/algo_matrix_job.py OUT_DIR RUNS.json

RUNS.json: {name: [override, ...]}. Each run writes its metrics to OUT_DIR/<name>/logs/metrics.jsonl
(trainer.logger=[file]) and its exit code to OUT_DIR/<name>/rc; tests/e2e/test_algos_e2e.py reads them.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """The digits task's reward, as two components (gdpo's): the answer and a format part."""
    from rlx.reward.functions import default_compute_score

    accuracy = float(default_compute_score(data_source, solution_str, ground_truth, extra_info))
    fmt = float(any(c.isdigit() for c in solution_str))
    return {"score": accuracy + 0.1 * fmt, "accuracy_reward": accuracy, "format_reward": fmt}
'''

BASE = ["trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
        "trainer.val_before_train=False", "trainer.test_freq=0", "trainer.logger=[file]", "trainer.save_freq=0",
        "data.train_batch_size=4", "data.val_files=synthetic://digits/size:4/seed:1", "data.max_response_length=8",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]


def main(out_dir: str, runs_file: str) -> None:
    import ray

    from rlx.trainer import console, launch, main_ppo
    from rlx.workers import group

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from key_recording import InProcessGroup, InProcessPool

    group.ResourcePool = InProcessPool
    for name in ("__init__", "run_all", "run_dp", "run_dp_metrics", "shutdown", "_method"):
        setattr(group.WorkerGroup, name, getattr(InProcessGroup, name))
    console.announce_worker_logs = lambda: None
    ray.is_initialized = lambda: True  # "someone else's Ray": main_ppo neither starts nor stops one
    launch.init_ray = lambda cfg, plan: None

    reward_file = os.path.join(out_dir, "reward.py")
    with open(reward_file, "w") as f:
        f.write(REWARD)
    with open(runs_file) as f:
        runs = json.load(f)
    for name, overrides in runs.items():
        run_dir = os.path.join(out_dir, name)
        os.makedirs(run_dir, exist_ok=True)
        argv = ["--config-name", "quickstart", *BASE, f"trainer.default_local_dir={run_dir}",
                *[o.replace("{reward_file}", reward_file) for o in overrides]]
        try:
            rc = main_ppo.main(argv)
        except BaseException:  # noqa: BLE001 -- recorded for the test to show
            traceback.print_exc()
            rc = -1
        with open(os.path.join(run_dir, "rc"), "w") as f:
            f.write(str(rc))
        print(f"run {name}: rc={rc}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
