"""Policy engine (actor or ref): log-probs and the PPO policy update. Plain Python, no Ray."""
from __future__ import annotations

import torch

from rlx.protocol import Batch
from rlx.trainer import core_algos
from rlx.workers.engine.base import FSDPEngine, device_memory_metrics, split_mini_micro


class ActorEngine(FSDPEngine):
    """`role="actor"` trains (needs actor_cfg); `role="ref"` only computes log-probs (no optimizer, no offload)."""

    def __init__(self, *, role: str, model_cfg, actor_cfg, fsdp_cfg, strategy: str, device, world_size: int,
                 rollout_n: int, temperature: float, total_steps: int = 1):
        self.actor_cfg, self.world_size, self.rollout_n, self.temperature = actor_cfg, world_size, rollout_n, temperature
        super().__init__(role=role, model_cfg=model_cfg, strategy=strategy, fsdp_cfg=fsdp_cfg, device=device,
                         optim_cfg=actor_cfg.optim if role == "actor" else None, total_steps=total_steps)

    def _log_probs(self, mb: Batch, with_entropy: bool):
        resp_len = mb["responses"].shape[1]
        logits = self.forward_logits(mb)[:, -resp_len - 1:-1].float()
        logits = logits / self.temperature
        responses = mb["responses"].to(self.device)
        log_probs = core_algos.logprobs_from_logits(logits, responses)
        entropy = None
        if with_entropy:
            entropy = core_algos.entropy_from_logits(logits)
        return log_probs, entropy

    @torch.no_grad()
    def compute_log_prob(self, batch: Batch, micro_batch_size: int, with_entropy: bool = False) -> Batch:
        """Per-token log-probs of `responses` (eval mode, no grad; activation offload untouched)."""
        self.train_mode(False)
        outs, ents = [], []
        with self.phase():
            for mb in batch.split(micro_batch_size):
                lp, ent = self._log_probs(mb, with_entropy)
                outs.append(lp.cpu())
                if with_entropy:
                    ents.append(ent.cpu())
        tensors = {"log_probs": torch.cat(outs)}
        if with_entropy:
            tensors["entropys"] = torch.cat(ents)
        return Batch(tensors)

    def update_policy(self, batch: Batch) -> dict:
        """PPO clipped policy update over mini-batches and micro-batches (grad accumulation)."""
        cfg = self.actor_cfg
        self.train_mode(True)
        mini = cfg.ppo_mini_batch_size * self.rollout_n // self.world_size
        micro = cfg.ppo_micro_batch_size_per_gpu
        metrics: dict[str, list[float]] = {}

        def add(k, v):
            metrics.setdefault(k, []).append(float(v))

        with self.phase(with_optimizer=True):
            for _, micro_batches in split_mini_micro(batch, mini, micro, cfg.ppo_epochs, cfg.shuffle,
                                                     cfg.data_loader_seed or 0):
                for mb in micro_batches:
                    mask = mb["response_mask"].to(self.device).float()
                    with self.micro_batch_context():
                        need_entropy = cfg.entropy_coeff != 0
                        log_prob, entropy = self._log_probs(mb, with_entropy=need_entropy)
                        pg_loss, clipfrac, ppo_kl, clipfrac_lower = core_algos.compute_policy_loss(
                            old_log_prob=mb["old_log_probs"].to(self.device), log_prob=log_prob,
                            advantages=mb["advantages"].to(self.device), response_mask=mask,
                            cliprange=cfg.clip_ratio, cliprange_low=cfg.clip_ratio_low,
                            cliprange_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
                            loss_agg_mode=cfg.loss_agg_mode)
                        loss = pg_loss
                        if need_entropy:
                            entropy_loss = core_algos.agg_loss(entropy, mask, cfg.loss_agg_mode)
                            loss = loss - cfg.entropy_coeff * entropy_loss
                            add("actor/entropy", entropy_loss.detach())
                        if cfg.use_kl_loss:
                            kld = core_algos.kl_penalty(log_prob, mb["ref_log_prob"].to(self.device),
                                                        cfg.kl_loss_type, key="actor_rollout_ref.actor.kl_loss_type")
                            kl_loss = core_algos.agg_loss(kld, mask, cfg.loss_agg_mode)
                            loss = loss + cfg.kl_loss_coef * kl_loss
                            add("actor/kl_loss", kl_loss.detach())
                            add("actor/kl_coef", cfg.kl_loss_coef)
                        (loss / len(micro_batches)).backward()
                    add("actor/pg_loss", pg_loss.detach())
                    add("actor/pg_clipfrac", clipfrac)
                    add("actor/ppo_kl", ppo_kl)
                    add("actor/pg_clipfrac_lower", clipfrac_lower)
                    if not need_entropy:
                        with torch.no_grad():
                            add("actor/entropy", core_algos.agg_loss(-log_prob.detach(), mask, cfg.loss_agg_mode))
                for k, v in self.optimizer_step(cfg.grad_clip).items():
                    add(f"actor/{k}", v)
            self.lr_scheduler.step()
        out = {k: sum(v) / len(v) for k, v in metrics.items()}
        out["actor/lr"] = self.lr_scheduler.get_last_lr()[0]
        out.update(device_memory_metrics(self.device, "update_actor"))
        out.update(self.offload_metrics("update_actor"))
        return out
