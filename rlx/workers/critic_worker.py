"""The critic worker: the value model (FSDP) for GAE; and `CriticGroup`, the driver's typed handle on its ranks."""
from __future__ import annotations

from rlx.config.schema import RLXConfig
from rlx.plan import JobPlan
from rlx.protocol import Batch
from rlx.workers.base_worker import Worker
from rlx.workers.group import ResourcePool, WorkerGroup
from rlx.workers.profiling import profiled


class CriticWorker(Worker):
    NAME = "critic"

    def profiler_roles(self) -> dict:
        return {"critic": self.cfg.critic.profiler}

    def init_model(self, total_steps: int) -> None:
        from rlx.engine.base import role_micro_batch_tokens
        from rlx.engine.critic import CriticEngine

        c = self.cfg.critic
        assert self.device is not None  # init_distributed ran
        self.critic = CriticEngine(critic_cfg=c, device=self.device, world_size=self.world_size,
                                   total_steps=total_steps,
                                   max_micro_batch_tokens=role_micro_batch_tokens(self.cfg.data, c))

    @profiled("critic_compute_values", role="critic")
    def compute_values(self, batch: Batch) -> Batch:
        m: dict = {}
        with self.measured("values", m):
            out = self.critic.compute_values(batch)
        out.meta = dict(out.meta, metrics=m)
        return out

    @profiled("critic_update", role="critic")
    def update_critic(self, batch: Batch) -> dict:
        m: dict = {}
        with self.measured("update_critic", m):
            out = self.critic.update_critic(batch)
        return {**out, **m}

    def save_checkpoint(self, path: str) -> None:
        from rlx.checkpoint.engine_state import save_engine

        save_engine(self.critic, path, contents=self.cfg.critic.checkpoint.save_contents)

    def load_checkpoint(self, path: str) -> None:
        from rlx.checkpoint.engine_state import load_engine

        load_engine(self.critic, path, contents=self.cfg.critic.checkpoint.load_contents)


class CriticGroup(WorkerGroup):
    """The critic ranks, as the driver calls them (each call runs on every rank)."""

    def __init__(self, pool: ResourcePool, cfg: RLXConfig, plan: JobPlan):
        super().__init__(CriticWorker, pool, cfg, plan)
        self.sp = cfg.critic.ulysses_sequence_parallel_size  # a sequence-parallel group's ranks share rows

    def init_model(self, total_steps: int) -> None:
        self.run_all(CriticWorker.init_model, total_steps)

    def compute_values(self, batch: Batch) -> Batch:
        """`values` of every response token."""
        return self.run_dp(CriticWorker.compute_values, batch, replicas=self.sp)

    def update(self, batch: Batch) -> dict:
        """One value-loss update on `batch`; the `critic/*` metrics (memory figures: max over ranks)."""
        return self.run_dp_metrics(CriticWorker.update_critic, batch, replicas=self.sp)

    def save(self, path: str) -> None:
        self.run_all(CriticWorker.save_checkpoint, path)

    def load(self, path: str) -> None:
        self.run_all(CriticWorker.load_checkpoint, path)
