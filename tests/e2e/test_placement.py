"""Placement of the colocated roles (rlx.workers.group) on a Ray with 2 declared (fake) GPUs.

Lightweight probe actors stand in for the workers: they are placed by the same `ResourcePool` / `WorkerGroup` code
and report the GPU ids Ray gave them, CUDA_VISIBLE_DEVICES, the GPU index the real worker would pick and their
bundle. Everything runs in one spawned child process with its own Ray (`ray.init(address="local", num_gpus=2)`),
so the session's Ray (conftest `ray_local`, no GPUs) is left alone.
"""
import multiprocessing
import re

import pytest


class Probe:
    """Has the worker's constructor and rendezvous methods; reports where Ray put it."""
    NAME = "probe"

    def __init__(self, cfg, rank: int, world_size: int):
        self.rank = rank

    def process_info(self):
        import os

        return "127.0.0.1", os.getpid()

    def addr_port(self):
        return "127.0.0.1", 0

    def init_distributed(self, master_addr: str, master_port: int) -> None:
        pass

    def report(self) -> dict:
        import os

        import ray

        from rlx.workers.base_worker import ray_local_gpu_index

        ctx = ray.get_runtime_context()
        # what the raylet granted, with the placement-group resource names (CPU_group_<bundle>_<pg id>)
        granted = ray._private.worker.global_worker.core_worker.resource_ids()
        bundles = {int(m.group(1)) for k in granted if (m := re.match(r"^CPU_group_(\d+)_[0-9a-f]+$", k))}
        gpu_ids = [str(i) for i in ray.get_gpu_ids()]
        return {"rank": self.rank, "gpu_ids": gpu_ids, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "local_index": ray_local_gpu_index() if gpu_ids else None, "bundles": sorted(bundles),
                "node": ctx.get_node_id()}


def _place(pool_args: dict, roles: list[str]) -> dict:
    import ray

    from rlx.workers.group import ResourcePool, WorkerGroup

    pool = ResourcePool(**pool_args, roles=len(roles))
    groups = {role: WorkerGroup(Probe, pool, None) for role in roles}
    out = {role: g.run_all("report") for role, g in groups.items()}
    out["bundle_of_rank"] = pool.bundle_of_rank
    pg = pool.pg
    for g in groups.values():
        g.shutdown()
    out["pg_state_after_shutdown"] = ray.util.placement_group_table(pg)["state"]
    return out


def _child(queue) -> None:
    import sys

    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False)
    result = {}
    try:
        result["ppo"] = _place(dict(nnodes=1, n_gpus_per_node=2, device="cuda"), ["actor", "critic"])
        result["grpo"] = _place(dict(nnodes=1, n_gpus_per_node=2, device="cuda"), ["actor"])
        result["cpu"] = _place(dict(nnodes=2, n_gpus_per_node=1, device="cpu"), ["actor", "critic"])
        try:
            _place(dict(nnodes=1, n_gpus_per_node=3, device="cuda"), ["actor"])
        except ValueError as e:
            result["too_many"] = str(e)
    except Exception as e:  # noqa: BLE001 -- reported to the test
        import traceback

        result["error"] = traceback.format_exc() + repr(e)
    finally:
        ray.shutdown()
    queue.put(result)


@pytest.fixture(scope="module")
def placed():
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue,))
    proc.start()
    result = queue.get(timeout=240)
    proc.join(timeout=60)
    assert "error" not in result, result["error"]
    return result


def test_actor_and_critic_share_gpus_rank_by_rank(placed):
    """PPO with a critic on 2 GPUs: every rank of a role on its own GPU, actor rank i with critic rank i."""
    ppo = placed["ppo"]
    actor_gpus = [r["gpu_ids"] for r in ppo["actor"]]
    critic_gpus = [r["gpu_ids"] for r in ppo["critic"]]
    assert all(len(g) == 1 for g in actor_gpus + critic_gpus), (actor_gpus, critic_gpus)
    assert len({g[0] for g in actor_gpus}) == 2, actor_gpus     # no two actor ranks on one GPU
    assert len({g[0] for g in critic_gpus}) == 2, critic_gpus   # no two critic ranks on one GPU
    assert actor_gpus == critic_gpus                              # actor rank i shares its GPU with critic rank i
    for role in ("actor", "critic"):
        for rank, r in enumerate(ppo[role]):
            assert r["rank"] == rank
            assert r["bundles"] == [ppo["bundle_of_rank"][rank]], r  # pinned to its own bundle
            assert r["cvd"] == r["gpu_ids"][0], r                    # Ray made its GPU the only visible one
            assert r["local_index"] == 0, r                          # so the worker uses cuda:0


def test_single_role_gets_one_gpu_per_rank(placed):
    grpo = placed["grpo"]
    gpus = [r["gpu_ids"] for r in grpo["actor"]]
    assert sorted(g[0] for g in gpus) == ["0", "1"], gpus
    assert [r["bundles"] for r in grpo["actor"]] == [[b] for b in grpo["bundle_of_rank"]]


def test_cpu_device_one_bundle_per_worker_slot(placed):
    cpu = placed["cpu"]
    for role in ("actor", "critic"):
        assert all(r["gpu_ids"] == [] for r in cpu[role]), cpu[role]
        assert [r["bundles"] for r in cpu[role]] == [[b] for b in cpu["bundle_of_rank"]]
    assert len(set(cpu["bundle_of_rank"])) == 2


def test_placement_group_released_with_its_last_group(placed):
    for case in ("ppo", "grpo", "cpu"):
        assert placed[case]["pg_state_after_shutdown"] == "REMOVED", placed[case]


def test_more_gpus_than_the_cluster_has_is_a_clear_error(placed):
    msg = placed["too_many"]
    assert "trainer.n_gpus_per_node=3" in msg and "needs 3 GPUs" in msg and "has 2" in msg, msg
