"""The GPU suite (`pytest -m gpu tests`) in groups that each fit one 9-minute run: `tests/gpu/gpu_suite.sh <k|list>`,
or `pytest -m gpu <the group's files> --gpu-group k`, which runs group k's tests only and prints a table of them
(outcome and seconds of each, then the totals) at the very end.

Every GPU test belongs to exactly one group (tests/unit/test_gpu_groups.py checks it on the CPU): a new GPU test goes
into a group here, with its estimated seconds on one H100. Groups are split by GPU count; long tests run alone.
Estimates: the GRPO recipe's 194 s was measured (run alone, H100); the rest are estimates from what each test runs
(a whole first run of the suite took 570 s for 41 of the 42 tests, recipes and the judge's included).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import pytest


@dataclass
class Group:
    title: str
    gpus: int
    needs: tuple[str, ...]
    """What must be importable or set for the group's tests to run rather than skip: hydra, ray, vllm, gsm8k
    ($RLX_GSM8K_DIR with GSM8K's train.jsonl / test.jsonl)."""
    tests: dict[str, int] = field(default_factory=dict)
    """Test id (a file, a test, or a test with its parameters) -> estimated seconds of all the tests it names."""

    def files(self) -> list[str]:
        return sorted({t.split("::")[0] for t in self.tests})

    def seconds(self) -> int:
        return sum(self.tests.values())


GROUPS = {
    1: Group("engines, kernels and offload in the pytest process (no Ray, no vLLM)", 1, ("hydra",), {
        "tests/e2e/test_attention_gpu.py": 15,
        "tests/e2e/test_engine_gpu.py": 25,
        "tests/e2e/test_liger_gpu.py": 20,  # skipped without liger_kernel
        "tests/e2e/test_long_gpu.py": 30,
        "tests/e2e/test_offload_gpu.py": 120,
        "tests/e2e/test_ops.py::test_fused_head_cuda_bf16_peak": 5,
        "tests/e2e/test_ops.py::test_tiled_mlp_cuda_peak": 10,
        "tests/e2e/test_tiled_layer.py::test_tiled_layer_cuda_bf16_peak_and_noise_floor": 10,
        "tests/e2e/test_triton_head.py::test_triton_equals_torch_backend_cuda_fp32": 30,
        "tests/e2e/test_triton_head.py::test_triton_equals_torch_backend_cuda_bf16_qwen_vocab": 20,
        "tests/e2e/test_profiler.py::test_torch_memory_writes_snapshots_of_the_step_and_at_out_of_memory": 25,
    }),
    2: Group("jobs through Ray on one GPU: HF rollout with offload, the vLLM engine's lifecycle, the default job "
             "with vLLM (20 steps), PPO + critic with vLLM", 1, ("hydra", "ray", "vllm"), {
        "tests/e2e/test_gpu_ray.py::test_grpo_fsdp2_offload_one_gpu": 45,
        "tests/e2e/test_gpu_ray.py::test_ppo_critic_fsdp_offload_one_gpu": 40,
        "tests/e2e/test_vllm_gpu.py::test_engine_lifecycle_in_a_ray_worker": 60,
        "tests/e2e/test_vllm_gpu.py::test_rollout_probs_match_the_actor_in_bf16": 110,  # runs the default job
        "tests/e2e/test_vllm_gpu.py::test_default_job_learns_with_vllm": 1,  # the same run
        "tests/e2e/test_vllm_gpu.py::test_ppo_critic_colocated_vllm_offload_memory_budget": 70,
    }),
    3: Group("examples/grpo_trainer/run_grpo_gsm8k.sh, 3 steps, Qwen2.5-0.5B dims", 1,
             ("hydra", "ray", "vllm", "gsm8k"), {
        "tests/e2e/test_vllm_gpu.py::test_gsm8k_recipe_on_one_gpu[run_grpo_gsm8k.sh]": 200,  # 194 s measured alone
    }),
    4: Group("examples/ppo_trainer/run_ppo_gsm8k.sh, 3 steps, Qwen2.5-0.5B dims", 1,
             ("hydra", "ray", "vllm", "gsm8k"), {
        "tests/e2e/test_vllm_gpu.py::test_gsm8k_recipe_on_one_gpu[run_ppo_gsm8k.sh]": 220,
    }),
    5: Group("examples/grpo_trainer/run_grpo_genrm.sh, 3 steps, 0.5B policy + 1.5B judge", 1,
             ("hydra", "ray", "vllm", "gsm8k"), {
        "tests/e2e/test_reward_judge_gpu.py::test_genrm_recipe_on_one_gpu": 300,
    }),
    6: Group("two GPUs: PPO + critic over 2 ranks (HF rollout); Ulysses SP=2 equals SP=1 over NCCL (fp32, exact) "
             "and at bf16 noise", 2, ("hydra", "ray"), {
        "tests/e2e/test_gpu_ray.py::test_ppo_critic_two_gpus": 60,
        "tests/e2e/test_ulysses.py::test_sp2_matches_sp1_on_two_gpus": 120,
        "tests/e2e/test_ulysses.py::test_sp2_logprobs_match_sp1_at_bf16_noise_on_two_gpus": 45,
    }),
}
BUDGET_S = 540
"""One run's limit: a 10-minute call, less start-up and collection."""


def matches(nodeid: str, test_id: str) -> bool:
    """`test_id` names this test: the file, the test (any parameters) or the test with these parameters."""
    return nodeid == test_id or nodeid.startswith((test_id + "::", test_id + "["))


def group_of(nodeid: str) -> list[int]:
    return [k for k, g in GROUPS.items() if any(matches(nodeid, t) for t in g.tests)]


def listing() -> str:
    lines = []
    for k, g in GROUPS.items():
        lines.append(f"group {k}: {g.gpus} GPU(s), ~{g.seconds()} s, needs {', '.join(g.needs)}: {g.title}")
        lines += [f"    {t}  (~{s} s)" for t, s in g.tests.items()]
    return "\n".join(lines)


class GroupRun:
    """pytest plugin of `--gpu-group k`: deselects every test outside group k, then prints the group's table."""

    def __init__(self, k: int):
        if k not in GROUPS:
            raise pytest.UsageError(f"--gpu-group {k}: no such group (groups: {sorted(GROUPS)}; "
                                    f"tests/gpu/gpu_suite.sh list)")
        self.k, self.group = k, GROUPS[k]
        self.items: list[str] = []
        self.skipped_files: dict[str, str] = {}  # a module skipped as a whole (importorskip) -> why
        self.outcome: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.start = time.monotonic()

    def pytest_collectreport(self, report):
        if report.skipped and report.nodeid.endswith(".py"):
            self.skipped_files[report.nodeid] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) \
                else str(report.longrepr)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        keep = [i for i in items if any(matches(i.nodeid, t) for t in self.group.tests)]
        drop = [i for i in items if i not in keep]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
        self.items = [i.nodeid for i in keep]
        missing = [t for t in self.group.tests if not any(matches(n, t) for n in self.items)
                   and t.split("::")[0] not in self.skipped_files]
        if missing:
            raise pytest.UsageError(f"--gpu-group {self.k}: no collected test matches {missing} (was it renamed? "
                                    f"tests/gpu_groups.py; run the group's files with -m gpu)")

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        now = self.outcome.get(report.nodeid)
        if report.failed:
            self.outcome[report.nodeid] = "failed" if report.when == "call" else "error"
        elif report.skipped and now is None:
            self.outcome[report.nodeid] = "skipped"
        elif report.passed and report.when == "call" and now is None:
            self.outcome[report.nodeid] = "passed"

    def table(self) -> str:
        width = max([len(n) for n in self.items] + [4])
        lines = [f"=== GPU suite, group {self.k}: {self.group.title}",
                 f"{'test':<{width}}  {'outcome':<8} {'seconds':>8}"]
        for n in self.items:
            lines.append(f"{n:<{width}}  {self.outcome.get(n, 'not run'):<8} {self.seconds.get(n, 0.0):>8.1f}")
        for f, why in self.skipped_files.items():
            lines.append(f"{f:<{width}}  {'skipped':<8} {'':>8}  (the whole file: {why})")
        counts = {o: sum(1 for n in self.items if self.outcome.get(n, "not run") == o)
                  for o in ("passed", "failed", "error", "skipped", "not run")}
        counts["skipped"] += len(self.skipped_files)
        lines.append(f"group {self.k}: {len(self.items)} tests, " + ", ".join(f"{v} {o}" for o, v in counts.items())
                     + f"; {time.monotonic() - self.start:.0f} s (estimate {self.group.seconds()} s)")
        return "\n".join(lines)

    def pytest_unconfigure(self, config):
        print("\n" + self.table(), file=sys.stdout, flush=True)


def main(argv: list[str]) -> int:
    """`python tests/gpu_groups.py list | files K | gpus K | needs K`: for tests/gpu/gpu_suite.sh."""
    if argv[:1] == ["list"]:
        print(listing())
        return 0
    if len(argv) == 2 and argv[0] in ("files", "gpus", "needs") and argv[1].isdigit() and int(argv[1]) in GROUPS:
        g = GROUPS[int(argv[1])]
        print(" ".join(g.files()) if argv[0] == "files" else g.gpus if argv[0] == "gpus" else " ".join(g.needs))
        return 0
    print(f"usage: gpu_groups.py list | files K | gpus K | needs K  (K in {sorted(GROUPS)})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
