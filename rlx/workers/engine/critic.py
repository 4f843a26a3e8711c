"""Value engine: per-token values and the clipped value-loss update. Plain Python, no Ray."""
from __future__ import annotations

import torch

from rlx.protocol import Batch
from rlx.trainer import core_algos
from rlx.workers.engine.base import FSDPEngine, device_memory_metrics, split_mini_micro


class CriticEngine(FSDPEngine):
    def __init__(self, *, critic_cfg, device, world_size: int, total_steps: int = 1):
        self.critic_cfg, self.world_size = critic_cfg, world_size
        super().__init__(role="critic", model_cfg=critic_cfg.model, strategy=critic_cfg.strategy,
                         fsdp_cfg=critic_cfg.model.fsdp_config, device=device, optim_cfg=critic_cfg.optim,
                         total_steps=total_steps)

    def _values(self, mb: Batch) -> torch.Tensor:
        resp_len = mb["responses"].shape[1]
        values = self.forward_logits(mb)[:, -resp_len - 1:-1, 0].float()
        return values * mb["response_mask"].to(self.device)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        self.train_mode(False)
        with self.phase():
            values = [self._values(mb).cpu() for mb in batch.split(self.critic_cfg.forward_micro_batch_size_per_gpu)]
        return Batch({"values": torch.cat(values)})

    def update_critic(self, batch: Batch) -> dict:
        cfg = self.critic_cfg
        self.train_mode(True)
        mini = cfg.ppo_mini_batch_size * cfg.rollout_n // self.world_size
        metrics: dict[str, list[float]] = {}
        with self.phase(with_optimizer=True):
            for _, micro_batches in split_mini_micro(batch, mini, cfg.ppo_micro_batch_size_per_gpu, cfg.ppo_epochs,
                                                     cfg.shuffle, 0):
                for mb in micro_batches:
                    mask = mb["response_mask"].to(self.device).float()
                    with self.micro_batch_context():
                        vpreds = self._values(mb)
                        vf_loss, vf_clipfrac = core_algos.compute_value_loss(
                            vpreds=vpreds, returns=mb["returns"].to(self.device),
                            values=mb["values"].to(self.device), response_mask=mask,
                            cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode)
                        (vf_loss / len(micro_batches)).backward()
                    metrics.setdefault("critic/vf_loss", []).append(float(vf_loss.detach()))
                    metrics.setdefault("critic/vf_clipfrac", []).append(float(vf_clipfrac))
                    metrics.setdefault("critic/vpred_mean", []).append(
                        float(core_algos.masked_mean(vpreds.detach(), mask)))
                for k, v in self.optimizer_step(cfg.grad_clip).items():
                    metrics.setdefault(f"critic/{k}", []).append(v)
            self.lr_scheduler.step()
        out = {k: sum(v) / len(v) for k, v in metrics.items()}
        out["critic/lr"] = self.lr_scheduler.get_last_lr()[0]
        out.update(device_memory_metrics(self.device, "update_critic"))
        out.update(self.offload_metrics("update_critic"))
        return out
