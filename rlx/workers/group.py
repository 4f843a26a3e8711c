"""A group of Ray actors of one worker class, one per data-parallel rank, forming one torch process group."""
from __future__ import annotations

import os

import ray

from rlx.protocol import Batch

# Environment every worker process needs (also set by the runtime-env file for cluster jobs).
WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"),
}


class WorkerGroup:
    def __init__(self, worker_cls, world_size: int, device: str, gpus_per_worker: float, *args):
        self.world_size = world_size
        env = dict(WORKER_ENV)
        for key in ("RLX_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
            if key in os.environ:
                env[key] = os.environ[key]
        if device == "cpu":
            env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        remote_cls = ray.remote(worker_cls)
        opts = dict(num_cpus=0.01, runtime_env={"env_vars": env})
        if device == "cuda":
            opts["num_gpus"] = gpus_per_worker
        self.workers = [remote_cls.options(**opts).remote(*args, rank, world_size) for rank in range(world_size)]
        addr, port = ray.get(self.workers[0].addr_port.remote())
        ray.get([w.init_distributed.remote(addr, port) for w in self.workers])

    def run_all(self, method: str, *args, **kwargs) -> list:
        """Call `method` on every rank with the same arguments; returns the per-rank results."""
        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def run_dp(self, method: str, batch: Batch, replicas: int = 1, **kwargs) -> Batch:
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
        refs = [getattr(w, method).remote(chunks[rank // replicas], **kwargs) for rank, w in enumerate(self.workers)]
        outs = ray.get(refs)[::replicas]
        out = Batch.concat(outs)
        return out.slice(0, size) if pad else out

    def run_dp_metrics(self, method: str, batch: Batch, **kwargs) -> dict:
        """Split `batch` across ranks; return the rank-mean of the returned metric dicts."""
        chunks = batch.chunk(self.world_size)
        outs = ray.get([getattr(w, method).remote(c, **kwargs) for w, c in zip(self.workers, chunks)])
        return {k: sum(o[k] for o in outs) / len(outs) for k in outs[0]}

    def shutdown(self):
        for w in self.workers:
            ray.kill(w)
