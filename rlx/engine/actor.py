"""Policy engine (actor or ref): log-probs and the PPO policy update. Plain Python, no Ray."""
from __future__ import annotations

from typing import Optional

import torch

from rlx.algos import core_algos
from rlx.algos.policy_losses import PolicyLossParams, get_policy_loss_fn
from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig, RefConfig
from rlx.protocol import Batch
from rlx.engine.base import FSDPEngine, UpdateSpec


class ActorEngine(FSDPEngine):
    """`role="actor"` trains (needs actor_cfg); `role="ref"` only computes log-probs (no optimizer, no offload).

    Log-probs (and entropy) come from the model's head evaluated at the response tokens only; with
    `model.use_fused_kernels` in chunks of `model.fused_kernel_options.chunk_size` tokens, never holding
    `[tokens, vocab]` logits (see `rlx.ops.log_prob_head`). `sp_size` > 1: Ulysses sequence parallelism (the
    ranks of a group get the same rows; `world_size // sp_size` data-parallel groups share a mini-batch).
    """

    def __init__(self, *, role: str, model_cfg: ModelConfig, actor_cfg: ActorConfig, fsdp_cfg: FSDPConfig,
                 strategy: str, device: torch.device, world_size: int, rollout_n: int, temperature: float,
                 total_steps: int = 1, sp_size: int = 1, max_micro_batch_tokens: Optional[int] = None,
                 entropy_cfg: Optional[ActorConfig | RefConfig] = None, bypass: Optional[dict] = None):
        self.actor_cfg, self.world_size, self.rollout_n, self.temperature = actor_cfg, world_size, rollout_n, temperature
        self.bypass = bypass  # rollout_correction.bypass_mode: {loss_type, correction} (rlx.algos.rollout_correction)
        self.fused = model_cfg.use_fused_kernels
        # the full-logits head's entropy (verl's keys of the role: actor.* for the actor, ref.* for the ref)
        ent = entropy_cfg if entropy_cfg is not None else actor_cfg
        ent_chunk, chunking = ent.entropy_from_logits_chunk_size, ent.entropy_from_logits_with_chunking
        if chunking and ent_chunk <= 0:
            raise ValueError(f"actor_rollout_ref.{role}.entropy_from_logits_chunk_size={ent_chunk}: must be a "
                             f"positive number of tokens (verl's default: 2048)")
        entropy_chunk: Optional[int] = ent_chunk if chunking else None
        from rlx.engine.heads import fused_head_backend

        backend = fused_head_backend(model_cfg, device) if self.fused else "torch"  # fused_kernel_options.impl_backend
        super().__init__(role=role, model_cfg=model_cfg, strategy=strategy, fsdp_cfg=fsdp_cfg, device=device,
                         optim_cfg=actor_cfg.optim if role == "actor" else None, total_steps=total_steps,
                         head_chunk_size=model_cfg.fused_kernel_options.chunk_size if self.fused else None,
                         sp_size=sp_size, sp_key=f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size",
                         max_micro_batch_tokens=max_micro_batch_tokens, entropy_chunk_size=entropy_chunk,
                         entropy_checkpointing=ent.entropy_checkpointing, head_backend=backend,
                         freeze_vision_tower=role == "actor" and actor_cfg.freeze_vision_tower)

    def _log_probs(self, mb: Batch, with_entropy: bool, with_sum_pi_squared: bool = False):
        """`(log_probs, entropy | None)`, plus `sum_pi_squared` with `with_sum_pi_squared` (see heads)."""
        return self.forward_tokens(mb, temperature=self.temperature, with_entropy=with_entropy,
                                   with_sum_pi_squared=with_sum_pi_squared)

    def compute_log_prob(self, batch: Batch, micro_batch_size: Optional[int], with_entropy: bool = False,
                         max_token_len: Optional[int] = None, with_sum_pi_squared: bool = False) -> Batch:
        """Per-token log-probs of `responses` (eval mode, no grad; activation offload untouched), in micro-batches
        of `micro_batch_size` rows or, with `max_token_len`, of at most that many tokens (dynamic batch size).
        `with_sum_pi_squared`: also `sum_pi_squared`, `sum_v pi_v^2` per token (actor.calculate_sum_pi_squared)."""
        def fn(mb):
            lp, ent, *spsq = self._log_probs(mb, with_entropy, with_sum_pi_squared)
            return {"log_probs": lp, **({"entropys": ent} if with_entropy else {}),
                    **({"sum_pi_squared": spsq[0]} if with_sum_pi_squared else {})}

        return self.forward_batch(batch, micro_batch_size, max_token_len, fn)

    def update_policy(self, batch: Batch) -> dict:
        """Policy update (`policy_loss.loss_mode`, + entropy bonus, + KL loss) over mini- and micro-batches."""
        cfg = self.actor_cfg
        policy_loss = get_policy_loss_fn(cfg.policy_loss.loss_mode)
        params = PolicyLossParams.of(cfg)
        need_entropy = cfg.entropy_coeff != 0
        dp = self.world_size // self.sp  # the ranks of a sequence-parallel group share rows
        spec = UpdateSpec(prefix="actor", mini_size=cfg.ppo_mini_batch_size * self.rollout_n // dp,
                          micro_size=cfg.ppo_micro_batch_size_per_gpu,
                          max_tokens=cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else None,
                          epochs=cfg.ppo_epochs, shuffle=cfg.shuffle, seed=cfg.data_loader_seed or 0,
                          grad_clip=cfg.grad_clip, loss_scale_factor=cfg.loss_scale_factor)

        def loss_fn(mb: Batch, gb: core_algos.GlobalBatchInfo):
            mask = mb["response_mask"].to(self.device).float()
            # the fused head gives the entropy from the same pass at little cost: always log the real one
            log_prob, entropy = self._log_probs(mb, with_entropy=need_entropy or self.fused)
            weights = mb.tensors.get("rollout_is_weights")
            if self.bypass is not None:  # the rollout's log-probs are the old ones; corrected per micro-batch
                from rlx.algos.rollout_correction import bypass_policy_loss

                pg_loss, means = bypass_policy_loss(
                    policy_loss, mb["old_log_probs"].to(self.device), log_prob, mb["advantages"].to(self.device),
                    mask, cfg.loss_agg_mode, params, gb, **self.bypass)
            else:
                pg_loss, means = policy_loss(
                    old_log_prob=mb["old_log_probs"].to(self.device), log_prob=log_prob,
                    advantages=mb["advantages"].to(self.device), response_mask=mask, loss_agg_mode=cfg.loss_agg_mode,
                    config=params, rollout_is_weights=None if weights is None else weights.to(self.device),
                    global_batch=gb)
            loss, shares = pg_loss, {"actor/pg_loss": pg_loss.detach()}
            if entropy is not None:
                entropy_loss = gb.agg(entropy if need_entropy else entropy.detach(), mask, cfg.loss_agg_mode)
                shares["actor/entropy"] = entropy_loss.detach()
                if need_entropy:
                    loss = loss - cfg.entropy_coeff * entropy_loss
            else:  # full-logits head without an entropy term: log the mean negative log-prob instead
                shares["actor/entropy"] = gb.agg(-log_prob.detach(), mask, cfg.loss_agg_mode)
            if cfg.use_kl_loss:
                kld = core_algos.kl_penalty(log_prob, mb["ref_log_prob"].to(self.device), cfg.kl_loss_type,
                                            key="actor_rollout_ref.actor.kl_loss_type")
                kl_loss = gb.agg(kld, mask, cfg.loss_agg_mode)
                loss = loss + cfg.kl_loss_coef * kl_loss
                shares["actor/kl_loss"] = kl_loss.detach()
                means["actor/kl_coef"] = cfg.kl_loss_coef
            return loss, shares, means

        return self.run_update(batch, spec, loss_fn)
