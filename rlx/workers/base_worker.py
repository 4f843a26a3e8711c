"""What every worker role shares: rank bookkeeping, joining the role's process group, the profiler."""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import time

import torch

from rlx.config.schema import RLXConfig
from rlx.plan import JobPlan
from rlx.workers.profiling import WorkerProfiler


def ray_local_gpu_index() -> int:
    """Index, among the CUDA devices this process sees, of the one GPU Ray assigned to this worker.

    Ray sets CUDA_VISIBLE_DEVICES to the assigned GPU, so this is 0; with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
    the process sees every GPU and the assigned id is the index.
    """
    import ray

    ids = [str(i) for i in ray.get_gpu_ids()]
    if len(ids) != 1:
        raise RuntimeError(f"a cuda worker must hold exactly one GPU of its bundle, Ray assigned {ids}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return int(ids[0])
    visible_ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids[0] not in visible_ids:
        raise RuntimeError(f"Ray assigned GPU {ids[0]} but CUDA_VISIBLE_DEVICES={visible!r}")
    return visible_ids.index(ids[0])


class Worker:
    NAME = "worker"
    """Names this worker process's traces."""

    def __init__(self, cfg: RLXConfig, plan: JobPlan, rank: int, world_size: int):
        """`plan`: the job plan (rlx.plan) the driver resolved: engines and roles are read there, never re-decided
        from the config."""
        self.cfg, self.plan, self.rank, self.world_size = cfg, plan, rank, world_size
        self.device: torch.device | None = None  # once the process group is joined (init_distributed)
        self.profiler: WorkerProfiler | None = None  # once the device is known (init_distributed)
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank{rank}] %(message)s")
        if cfg.trainer.device == "cpu":
            torch.set_num_threads(1)

    def process_info(self) -> tuple[str, int]:
        """(this worker's node address, its process id): what the driver names when the worker dies."""
        import ray

        return ray.util.get_node_ip_address(), os.getpid()

    def addr_port(self) -> tuple[str, int]:
        """This node's address and a free port on it."""
        host, ports = self.addr_ports(1)
        return host, ports[0]

    def addr_ports(self, n: int) -> tuple[str, list[int]]:
        """This node's address and `n` distinct free ports on it (held together while picked)."""
        import ray

        with contextlib.ExitStack() as stack:
            socks = [stack.enter_context(socket.socket()) for _ in range(n)]
            for s in socks:
                s.bind(("", 0))
            return ray.util.get_node_ip_address(), [s.getsockname()[1] for s in socks]

    def process_group_timeout_s(self) -> float:
        """How long a collective of this role's process group may wait for the other ranks: verl's FSDP critic
        (and any role without an `nccl_timeout` key) uses 600 s; the actor worker overrides it."""
        return 600

    def init_distributed(self, master_addr: str | None = None, master_port: int | None = None) -> None:
        """Join the role's process group at master_addr:master_port; without an address, make a group of this rank
        alone, at a free port of its node (`self.rank` stays the rank in the role)."""
        from rlx.engine.fsdp import init_distributed

        if self.cfg.trainer.device == "cuda":
            # the engine picks cuda:LOCAL_RANK: make that the GPU of this worker's bundle
            os.environ["LOCAL_RANK"] = str(ray_local_gpu_index())
        rank, world = self.rank, self.world_size
        if master_addr is None:
            (master_addr, master_port), rank, world = self.addr_port(), 0, 1
        self.device = init_distributed(self.cfg.trainer.device, rank, world, master_addr, master_port,
                                       timeout_s=self.process_group_timeout_s())
        torch.manual_seed(self.cfg.trainer.seed)
        # before the model: torch_memory records the allocator's history from here on
        self.profiler = WorkerProfiler(self.NAME, self.profiler_roles(), self.cfg.global_profiler, self.rank,
                                       self.device)

    def profiler_roles(self) -> dict:
        """{role: its profiler config} of the roles this process runs (first: the one whose options the process-wide
        trace takes)."""
        raise NotImplementedError

    def start_profile(self, step: int) -> None:
        """A profiled window begins (or goes on) at training step `step` (global_profiler.steps)."""
        assert self.profiler is not None  # init_distributed made it
        self.profiler.start(step)

    def stop_profile(self) -> list[str]:
        """The profiled window ends: its traces are written; returns their paths."""
        assert self.profiler is not None  # init_distributed made it
        return self.profiler.stop()

    @contextlib.contextmanager
    def measured(self, phase: str, metrics: dict, timing: str | None = None):
        """On CUDA, record into `metrics` the GPU memory in use once `phase` is over (`perf/gpu_memory_gib/after_
        <phase>`: the device's total minus its free memory, so everything on the GPU counts: torch's cached blocks,
        vLLM's pool, a colocated role); with `timing`, also the phase's seconds (`timing_s/<timing>`, summed when
        the phase repeats; on CUDA its kernels are waited for, so the time is the phase's own). Nothing on CPU but
        the timing."""
        cuda = self.device is not None and self.device.type == "cuda"
        start = time.perf_counter()
        yield
        if cuda:
            torch.cuda.synchronize()
        if timing:
            key = f"timing_s/{timing}"
            metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - start
        if cuda:
            free, total = torch.cuda.mem_get_info()
            metrics[f"perf/gpu_memory_gib/after_{phase}"] = (total - free) / 2**30
            metrics["perf/gpu_memory_gib/total"] = total / 2**30
