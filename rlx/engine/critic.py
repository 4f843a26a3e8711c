"""Value engine: per-token values and the clipped value-loss update. Plain Python, no Ray."""
from __future__ import annotations

from typing import Optional

import torch

from rlx.algos import core_algos
from rlx.config.schema import CriticConfig
from rlx.protocol import Batch
from rlx.engine.base import FSDPEngine, UpdateSpec


class CriticEngine(FSDPEngine):
    def __init__(self, *, critic_cfg: CriticConfig, device: torch.device, world_size: int, total_steps: int = 1,
                 max_micro_batch_tokens: Optional[int] = None):
        self.critic_cfg, self.world_size = critic_cfg, world_size
        super().__init__(role="critic", model_cfg=critic_cfg.model, strategy=critic_cfg.strategy,
                         fsdp_cfg=critic_cfg.model.fsdp_config, device=device, optim_cfg=critic_cfg.optim,
                         total_steps=total_steps, sp_size=critic_cfg.ulysses_sequence_parallel_size,
                         sp_key="critic.ulysses_sequence_parallel_size", max_micro_batch_tokens=max_micro_batch_tokens)

    def _values(self, mb: Batch) -> torch.Tensor:
        return self.forward_tokens(mb)

    def compute_values(self, batch: Batch) -> Batch:
        cfg = self.critic_cfg
        return self.forward_batch(batch, cfg.forward_micro_batch_size_per_gpu,
                                  cfg.forward_max_token_len_per_gpu if cfg.use_dynamic_bsz else None,
                                  lambda mb: {"values": self._values(mb)})

    def update_critic(self, batch: Batch) -> dict:
        cfg = self.critic_cfg
        dp = self.world_size // self.sp  # the ranks of a sequence-parallel group share rows
        spec = UpdateSpec(prefix="critic", mini_size=cfg.ppo_mini_batch_size * cfg.rollout_n // dp,
                          micro_size=cfg.ppo_micro_batch_size_per_gpu,
                          max_tokens=cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else None,
                          epochs=cfg.ppo_epochs, shuffle=cfg.shuffle, seed=0, grad_clip=cfg.grad_clip,
                          loss_scale_factor=cfg.loss_scale_factor)

        def loss_fn(mb: Batch, gb: core_algos.GlobalBatchInfo):
            mask = mb["response_mask"].to(self.device).float()
            vpreds = self._values(mb)
            vf_loss, vf_clipfrac = core_algos.compute_value_loss(
                vpreds=vpreds, returns=mb["returns"].to(self.device), values=mb["values"].to(self.device),
                response_mask=mask, cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode,
                **gb.kwargs())
            means = {"critic/vf_clipfrac": vf_clipfrac,
                     "critic/vpred_mean": core_algos.masked_mean(vpreds.detach(), mask)}
            return vf_loss, {"critic/vf_loss": vf_loss.detach()}, means

        return self.run_update(batch, spec, loss_fn)
