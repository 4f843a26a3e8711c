"""The critic worker: the value model (FSDP) for GAE."""
from __future__ import annotations

from rlx.protocol import Batch
from rlx.workers.base_worker import Worker


class CriticWorker(Worker):
    def init_model(self, total_steps: int) -> None:
        from rlx.workers.engine.critic import CriticEngine

        self.critic = CriticEngine(critic_cfg=self.cfg.critic, device=self.device, world_size=self.world_size,
                                   total_steps=total_steps)

    def compute_values(self, batch: Batch) -> Batch:
        return self.critic.compute_values(batch)

    def update_critic(self, batch: Batch) -> dict:
        return self.critic.update_critic(batch)

    def save_checkpoint(self, path: str) -> None:
        from rlx.checkpoint import save_engine

        save_engine(self.critic, path, contents=self.cfg.critic.checkpoint.save_contents)

    def load_checkpoint(self, path: str) -> None:
        from rlx.checkpoint import load_engine

        load_engine(self.critic, path, contents=self.cfg.critic.checkpoint.load_contents)
