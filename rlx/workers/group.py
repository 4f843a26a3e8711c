"""Where workers run (one placement group shared by the colocated roles) and the worker group of one role.

verl's colocated layout: `ResourcePool` reserves one Ray placement group with one bundle per GPU
(`trainer.nnodes * trainer.n_gpus_per_node` bundles of {GPU: 1, CPU: 1}; with `trainer.device=cpu` one bundle of
{CPU: 1} per worker slot). Every role (actor/rollout/ref, critic, later a reward model) is a `WorkerGroup` with one
rank per bundle: rank i of every role is pinned to the same bundle i and asks for 1/roles of its GPU (and CPU), so
actor rank i and critic rank i share GPU i while no two ranks of one role ever share a GPU (NCCL refuses that:
"Duplicate GPU detected"). Ray sets CUDA_VISIBLE_DEVICES of each worker to its bundle's GPU. Each role's ranks form
their own torch process group (the rendezvous address is the role's rank 0).

The driver talks to a role through its typed group (`ActorGroup` in rlx.workers.actor_worker, `CriticGroup` in
rlx.workers.critic_worker): named methods that name the worker method they call, dispatched here by `run_all`
(every rank, same arguments), `run_dp` (the batch split over ranks) or `run_dp_metrics` (the same, metrics reduced).
"""
from __future__ import annotations

import glob
import logging
import os
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Union

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlx.protocol import Batch

log = logging.getLogger("rlx")

Method = Union[str, Callable]
"""A worker method: the function itself (`ActorRolloutRefWorker.compute_log_prob`), or its name."""

# Environment every worker process needs (also set by the runtime-env file for cluster jobs).
WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"),
}


class ResourcePool:
    """One placement group, one bundle per GPU (or CPU worker slot), shared by `roles` colocated worker groups.

    Rank r of every group goes to bundle `bundle_of_rank[r]`: bundles ordered node by node (nodes in the order of
    their lowest bundle), so consecutive ranks share a node (vLLM tensor-parallel groups stay on one node).
    The placement group is removed when the last group using it shuts down (or by `remove()`).
    """

    WAIT_LOG_S = 30.0
    WAIT_LIMIT_S = 600.0

    def __init__(self, nnodes: int, n_gpus_per_node: int, device: str, roles: int, name: str = "rlx",
                 ranks_per_bundle: int = 1):
        assert device in ("cuda", "cpu"), device  # resolved at config load (trainer.device)
        assert ranks_per_bundle >= 1, ranks_per_bundle
        self.device, self.roles, self.ranks_per_bundle = device, roles, ranks_per_bundle
        self.bundles = nnodes * n_gpus_per_node
        self.world_size = self.bundles * ranks_per_bundle  # ranks of each group: ranks_per_bundle per bundle
        bundle = {"GPU": 1.0, "CPU": 1.0} if device == "cuda" else {"CPU": 1.0}
        self._check_cluster(bundle, nnodes, n_gpus_per_node)
        self.pg = placement_group([dict(bundle) for _ in range(self.bundles)], strategy="PACK",
                                  name=f"{name}_{os.getpid()}_{time.monotonic_ns()}")
        self._wait_ready(bundle)
        node_of = placement_group_table(self.pg)["bundles_to_node_id"]
        first: dict = {}
        for index in range(self.bundles):
            first.setdefault(node_of[index], index)
        order = sorted(range(self.bundles), key=lambda i: (first[node_of[i]], i))
        # ranks b*k .. b*k+k-1 share the b-th bundle (k = ranks_per_bundle)
        self.bundle_of_rank = [order[r // ranks_per_bundle] for r in range(self.world_size)]
        self.node_of_rank = [node_of[i] for i in self.bundle_of_rank]
        self._users: set[int] = set()

    def _check_cluster(self, bundle: dict, nnodes: int, n_gpus_per_node: int) -> None:
        total = ray.cluster_resources()
        for res, amount in bundle.items():
            need = amount * self.bundles
            have = total.get(res, 0.0)
            if have < need:
                what = "GPUs" if res == "GPU" else "CPUs (one per worker slot)"
                fix = ("set trainer.device=cpu, or run where the GPUs are" if res == "GPU" and have == 0 else
                       "lower trainer.nnodes / trainer.n_gpus_per_node, or add nodes to the cluster")
                raise ValueError(f"trainer.nnodes={nnodes} x trainer.n_gpus_per_node={n_gpus_per_node} needs "
                                 f"{need:g} {what} (trainer.device={self.device}), but the Ray cluster has "
                                 f"{have:g}. Fix: {fix}.")

    def _wait_ready(self, bundle: dict) -> None:
        start = time.monotonic()
        ready = self.pg.ready()
        while not ray.wait([ready], timeout=self.WAIT_LOG_S)[0]:
            waited = time.monotonic() - start
            msg = (f"placement group of {self.bundles} x {bundle} not ready after {waited:.0f}s "
                   f"(available now: {ray.available_resources()})")
            if waited >= self.WAIT_LIMIT_S:
                remove_placement_group(self.pg)
                raise RuntimeError(msg + ": another job holds the resources, or the nodes cannot fit the bundles")
            log.warning("%s; waiting", msg)

    def options(self, rank: int) -> dict:
        """Ray actor options of `rank` of one role: pinned to its bundle, 1/(roles x ranks_per_bundle) of the
        bundle's resources."""
        share = 1.0 / (self.roles * self.ranks_per_bundle)
        opts = dict(num_cpus=share, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=self.bundle_of_rank[rank]))
        if self.device == "cuda":
            opts["num_gpus"] = share
        return opts

    def attach(self, group) -> None:
        self._users.add(id(group))

    def detach(self, group) -> None:
        self._users.discard(id(group))
        if not self._users:
            self.remove()

    def remove(self) -> None:
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


@dataclass
class WorkerInfo:
    """Who a worker is, for the line that ends a run when it dies."""
    role: str
    rank: int
    node: str
    """The node's address."""
    pid: int


_GROUPS: "weakref.WeakSet[WorkerGroup]" = weakref.WeakSet()
"""The live worker groups of this driver (`dead_workers` checks theirs)."""


def dead_workers(timeout_s: float = 10.0) -> list[WorkerInfo]:
    """The workers of the live groups whose process is gone (Ray answers for a dead actor at once; a live one busy
    with a long call is taken as alive after `timeout_s`)."""
    probes = {w.__ray_ready__.remote(): g.info[rank] for g in list(_GROUPS) for rank, w in enumerate(g.workers)}
    if not probes:
        return []
    ready, _ = ray.wait(list(probes), num_returns=len(probes), timeout=timeout_s)
    dead = []
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            dead.append(probes[ref])
    return sorted(dead, key=lambda i: (i.role, i.rank))


def log_tail(info: WorkerInfo, lines: int = 10) -> tuple[str, list[str]]:
    """(the worker's log file, its last `lines` lines) when the log is on this node (Ray's worker-*-<pid>.err,
    else .out), else (where it is on its node, [])."""
    try:
        import ray._private.worker as ray_worker

        node = ray_worker.global_worker.node
        if node is None:  # not connected: no logs dir to ask for
            raise AttributeError("no Ray node")
        logs = node.get_logs_dir_path()
    except AttributeError:  # a Ray without this (private) accessor
        return f"<ray temp dir>/session_latest/logs/worker-*-{info.pid}.err on {info.node}", []
    pattern = os.path.join(logs, f"worker-*-{info.pid}")
    if info.node != ray.util.get_node_ip_address():
        return f"{pattern}.err on node {info.node}", []
    for ext in (".err", ".out"):
        for path in sorted(glob.glob(pattern + ext)):
            with open(path, errors="replace") as f:
                tail = [line.rstrip("\n") for line in f.readlines()[-200:] if line.strip()][-lines:]
            if tail:
                return path, tail
    return f"{pattern}.err", []


class WorkerGroup:
    """The ranks of one role, one Ray actor per rank of `pool`, forming one torch process group (with `lone`: each
    rank a process group of its own, for ranks that never talk to each other, such as rollout engines several of
    which may share a GPU, which NCCL refuses within one group)."""

    def __init__(self, worker_cls, pool: ResourcePool, *args, lone: bool = False):
        self.pool, self.world_size = pool, pool.world_size
        env = dict(WORKER_ENV, RLX_DRIVER_CWD=os.getcwd())  # relative output paths are the driver's
        for key in ("RLX_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "TRITON_INTERPRET", "RLX_WEIGHT_TRANSFER"):  # (interpret: impl_backend=triton)
            if key in os.environ:
                env[key] = os.environ[key]
        if pool.device == "cpu":
            env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        remote_cls = ray.remote(worker_cls)
        self.workers = [remote_cls.options(runtime_env={"env_vars": env}, **pool.options(rank)).remote(
            *args, rank, self.world_size) for rank in range(self.world_size)]
        pool.attach(self)
        self.info = [WorkerInfo(worker_cls.NAME, rank, node, pid) for rank, (node, pid) in
                     enumerate(ray.get([w.process_info.remote() for w in self.workers]))]
        _GROUPS.add(self)
        if lone:
            ray.get([w.init_distributed.remote() for w in self.workers])  # each rank a group of its own
            where = "one per rank"
        else:
            addr, port = ray.get(self.workers[0].addr_port.remote())
            ray.get([w.init_distributed.remote(addr, port) for w in self.workers])
            where = f"{addr}:{port}"
        log.info("%s: %d ranks, rendezvous %s, rank -> (bundle, node): %s", worker_cls.__name__,
                 self.world_size, where,
                 ", ".join(f"{r}->({b}, {n[:8]})" for r, (b, n) in enumerate(zip(pool.bundle_of_rank,
                                                                               pool.node_of_rank))))

    def run_all(self, method: Method, *args, **kwargs) -> list:
        """Call `method` on every rank with the same arguments; returns the per-rank results (the first rank's
        failure raises at once)."""
        refs = [getattr(w, _name(method)).remote(*args, **kwargs) for w in self.workers]
        try:
            return ray.get(refs)
        except Exception:
            _read_failures(refs)
            raise

    def run_dp(self, method: Method, batch: Batch, replicas: int = 1, **kwargs) -> Batch:
        """Split `batch` across ranks (padding with repeated rows if needed), call, concatenate.

        `replicas` > 1 gives each run of that many consecutive ranks the same chunk (a vLLM tensor-parallel
        group generates together) and keeps the first rank's result of each run.
        """
        assert self.world_size % replicas == 0, (self.world_size, replicas)
        dp = self.world_size // replicas
        size = len(batch)
        pad = (-size) % dp
        if pad:
            batch = Batch.concat([batch, batch.index(list(range(pad)))])
        chunks = batch.chunk(dp)
        refs = [getattr(w, _name(method)).remote(chunks[rank // replicas], **kwargs)
                for rank, w in enumerate(self.workers)]
        outs = ray.get(refs)[::replicas]
        out = Batch.concat(outs)
        if "metrics" in outs[0].meta:  # per-rank metrics of the call (timings, memory): reduced over ranks
            out.meta = dict(out.meta, metrics=reduce_metrics([o.meta["metrics"] for o in outs]))
        return out.slice(0, size) if pad else out

    def run_dp_metrics(self, method: Method, batch: Batch, replicas: int = 1, **kwargs) -> dict:
        """Split `batch` across ranks (runs of `replicas` consecutive ranks share a chunk: a sequence-parallel
        group); return the rank-mean of the returned metric dicts, except memory figures (`perf/*memory*`,
        `perf/*offload_pool*`), which are the max over ranks: the rank that runs out first."""
        assert self.world_size % replicas == 0, (self.world_size, replicas)
        chunks = batch.chunk(self.world_size // replicas)
        outs = ray.get([getattr(w, _name(method)).remote(chunks[rank // replicas], **kwargs)
                        for rank, w in enumerate(self.workers)])
        return reduce_metrics(outs)

    def start_profile(self, step: int) -> None:
        """Every rank: a profiled window begins (or goes on) at training step `step` (rlx.workers.profiling)."""
        self.run_all("start_profile", step)

    def stop_profile(self) -> list[str]:
        """Every rank: the window ends; the trace files written (all ranks)."""
        return [path for paths in self.run_all("stop_profile") for path in paths]

    def shutdown(self):
        """Kill this role's workers; the pool's placement group goes when its last group is shut down."""
        _GROUPS.discard(self)
        for w in self.workers:
            ray.kill(w)
        self.workers = []
        self.pool.detach(self)


def _read_failures(refs: list, grace_s: float = 5.0) -> None:
    """Read the calls of `refs` that end within `grace_s` (after another rank's failure: mostly the same failure,
    which Ray would otherwise print as an unhandled error); a rank still waiting for the failed one in a collective
    is left to the run's cleanup."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=grace_s)
    for ref in ready:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001 - the first rank's failure is the one raised
            pass


def _name(method: Method) -> str:
    return method if isinstance(method, str) else method.__name__


def reduce_metrics(outs: list[dict]) -> dict:
    """The rank-mean of per-rank metric dicts; memory figures are the max over ranks."""
    return {k: (max(o[k] for o in outs) if _is_peak(k) else sum(o[k] for o in outs) / len(outs)) for k in outs[0]}


def _is_peak(metric: str) -> bool:
    return metric.startswith("perf/") and ("memory" in metric or "offload_pool" in metric)
