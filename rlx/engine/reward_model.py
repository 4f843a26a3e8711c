"""Reward-model engine: an FSDP-wrapped one-label classifier that scores sequences at their last valid token.
Plain Python, no Ray. No optimizer; its parameters may live on the CPU between calls (fsdp_config.param_offload)."""
from __future__ import annotations

from typing import Optional

import torch

from rlx.config.schema import RewardModelConfig
from rlx.engine.base import FSDPEngine
from rlx.engine.packing import last_token_inputs
from rlx.protocol import Batch


class RewardModelEngine(FSDPEngine):
    def __init__(self, *, rm_cfg: RewardModelConfig, strategy: str, device: torch.device, world_size: int):
        self.rm_cfg, self.world_size = rm_cfg, world_size
        super().__init__(role="reward", model_cfg=_as_model_cfg(rm_cfg), strategy=strategy,
                         fsdp_cfg=rm_cfg.model.fsdp_config, device=device, dtype=rm_cfg.rollout.dtype)

    def _scores(self, mb: Batch) -> torch.Tensor:
        ti = last_token_inputs(mb, self.device, self.remove_padding)
        return ti.scatter(self.module(**ti.kwargs))[:, 0]

    def compute_rm_score(self, batch: Batch, micro_size: Optional[int], max_tokens: Optional[int]) -> Batch:
        """`rm_score` `[rows]`: the model's output at each row's last valid token (rows as in `batch`)."""
        return self.forward_batch(batch, micro_size, max_tokens, lambda mb: {"rm_score": self._scores(mb)})


def _as_model_cfg(rm_cfg: RewardModelConfig):
    """The reward model's keys as the engine's model config (no training: no checkpointing, offload or LoRA)."""
    from rlx.config.schema import CriticModelConfig

    m = rm_cfg.model
    assert m.path is not None  # validation refuses reward_model.enable without reward_model.model.path
    return CriticModelConfig(path=m.path, tokenizer_path=m.path, override_config=dict(m.override_config),
                             external_lib=m.external_lib, enable_gradient_checkpointing=False,
                             enable_activation_offload=False, trust_remote_code=m.trust_remote_code,
                             use_remove_padding=m.use_remove_padding, fsdp_config=m.fsdp_config)
