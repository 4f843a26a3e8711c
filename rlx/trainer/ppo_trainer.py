"""The PPO/GRPO driver loop: a short list of named steps, each a call into a worker group or a pure function."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import uuid
from contextlib import contextmanager

import numpy as np
from tqdm import tqdm

from rlx.protocol import Batch
from rlx.trainer import core_algos
from rlx.trainer.metrics import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics
from rlx.trainer.tracking import Tracker
from rlx.workers.rollout.probs_diff import rollout_probs_diff

log = logging.getLogger("rlx")


@contextmanager
def timed(name: str, timing: dict):
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


class RayPPOTrainer:
    def __init__(self, cfg, rollout_name: str):
        from transformers import AutoTokenizer

        from rlx.data.dataset import PromptLoader, RLDataset
        from rlx.data.reward import RewardManager, load_reward_fn
        from rlx.models import resolve_model_path

        self.cfg, self.rollout_name = cfg, rollout_name
        arr, data = cfg.actor_rollout_ref, cfg.data
        self.world_size = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
        self.use_critic = cfg.algorithm.adv_estimator == "gae"
        self.use_ref = arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(data.tokenizer or arr.model.path),
                                                       trust_remote_code=arr.model.trust_remote_code)
        self.train_loader = PromptLoader(RLDataset(data.train_files, self.tokenizer, data), data.train_batch_size,
                                         shuffle=data.shuffle, seed=data.seed)
        self.val_loader = PromptLoader(RLDataset(data.val_files, self.tokenizer, data), data.val_batch_size,
                                       shuffle=False, drop_last=False)
        score_fn = load_reward_fn(cfg.custom_reward_function, cfg.reward_model.reward_kwargs)
        self.reward_fn = RewardManager(self.tokenizer, score_fn, data.reward_fn_key)
        t = cfg.trainer
        self.total_steps = t.total_training_steps or len(self.train_loader) * t.total_epochs
        self.kl_ctrl = core_algos.get_kl_controller(cfg.algorithm.kl_ctrl.type, cfg.algorithm.kl_ctrl.kl_coef,
                                                    cfg.algorithm.kl_ctrl.target_kl, cfg.algorithm.kl_ctrl.horizon)
        self.global_step = 0
        self.val_history: list[dict] = []

    # ---- setup ----------------------------------------------------------------------------------------
    def init_workers(self) -> None:
        from rlx.workers.actor_worker import ActorRolloutRefWorker
        from rlx.workers.critic_worker import CriticWorker
        from rlx.workers.group import WorkerGroup

        device = self.cfg.trainer.device
        share = 0.5 if self.use_critic else 1.0  # actor and critic colocate on each GPU
        self.actor_wg = WorkerGroup(ActorRolloutRefWorker, self.world_size, device, share, self.cfg)
        self.actor_wg.run_all("init_model", self.total_steps, self.rollout_name)
        self.critic_wg = None
        if self.use_critic:
            self.critic_wg = WorkerGroup(CriticWorker, self.world_size, device, share, self.cfg)
            self.critic_wg.run_all("init_model", self.total_steps)

    # ---- the loop -------------------------------------------------------------------------------------
    def fit(self) -> list[dict]:
        if not hasattr(self, "actor_wg"):
            self.init_workers()
        log_dir = os.path.join(self.cfg.trainer.default_local_dir, "logs")
        self.tracker = Tracker(self.cfg, log_dir)
        history = []
        self.resume()
        if self.cfg.trainer.val_before_train or self.cfg.trainer.val_only:
            self.tracker.log(self.validate(), step=self.global_step)
        if self.cfg.trainer.val_only:
            self.tracker.close()
            return history
        bar = tqdm(total=self.total_steps, initial=self.global_step, desc="rlx", disable=not sys.stderr.isatty())
        while self.global_step < self.total_steps:
            self.global_step += 1
            metrics = self.train_step(self.train_loader.next_batch())
            if self._due(self.cfg.trainer.test_freq) or self.global_step == self.total_steps:
                metrics.update(self.validate())
            if self._due(self.cfg.trainer.save_freq) or (self.cfg.trainer.save_freq > 0
                                                         and self.global_step == self.total_steps):
                start = time.perf_counter()
                self.save_checkpoint()
                metrics["timing_s/save_checkpoint"] = time.perf_counter() - start
            self.tracker.log(metrics, step=self.global_step)
            history.append(metrics)
            bar.set_postfix(score=f"{metrics['critic/score/mean']:.3f}", step_s=f"{metrics['timing_s/step']:.1f}")
            bar.update(1)
        bar.close()
        self.tracker.close()
        return history

    def _due(self, freq: int) -> bool:
        return freq > 0 and self.global_step % freq == 0

    def train_step(self, prompts: Batch) -> dict:
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with timed("step", timing):
            with timed("gen", timing):
                batch = self.generate(prompts, validate=False)
            with timed("reward", timing):
                self.compute_reward(batch, metrics)
            with timed("old_log_prob", timing):
                batch = batch.union(self.actor_wg.run_dp("compute_log_prob", batch))
            if "rollout_log_probs" in batch:
                metrics.update(rollout_probs_diff(batch["rollout_log_probs"], batch["old_log_probs"],
                                                  batch["response_mask"]))
            if self.use_ref:
                with timed("ref", timing):
                    batch = batch.union(self.actor_wg.run_dp("compute_ref_log_prob", batch))
            if self.use_critic:
                with timed("values", timing):
                    batch = batch.union(self.critic_wg.run_dp("compute_values", batch))
            with timed("adv", timing):
                self.compute_advantage(batch, metrics)
            if self.use_critic:
                with timed("update_critic", timing):
                    metrics.update(self.critic_wg.run_dp_metrics("update_critic", batch))
            if self.global_step > self.cfg.trainer.critic_warmup:
                with timed("update_actor", timing):
                    metrics.update(self.actor_wg.run_dp_metrics("update_actor", batch))
        metrics.update(compute_data_metrics(batch.tensors, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(timing))
        for stat in ("max_memory_allocated_gb", "max_memory_reserved_gb", "cpu_memory_used_gb"):
            phases = [v for k, v in metrics.items() if k.startswith("perf/update_") and k.endswith(stat)]
            if phases:
                metrics[f"perf/{stat}"] = max(phases)
        metrics.update(compute_throughput_metrics(int(batch["attention_mask"].sum()), timing["step"],
                                                  self.world_size))
        return metrics

    # ---- steps ----------------------------------------------------------------------------------------
    def generate(self, prompts: Batch, validate: bool) -> Batch:
        """Rollout on the actor workers; returns rows repeated n times with prompt fields and group uids."""
        r = self.cfg.actor_rollout_ref.rollout
        vk = r.val_kwargs
        sampling = (dict(n=vk.n, do_sample=vk.do_sample, temperature=vk.temperature, top_p=vk.top_p, top_k=vk.top_k)
                    if validate else
                    dict(n=r.n, do_sample=r.do_sample, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k))
        gen_in = prompts.select("input_ids", "attention_mask", "position_ids")
        gen_in.meta = dict(sampling, seed=r.seed + self.global_step)
        tp = r.tensor_model_parallel_size if self.rollout_name == "vllm" else 1
        out = self.actor_wg.run_dp("generate_sequences", gen_in, replicas=tp)
        info = Batch(non_tensors={**prompts.non_tensors,
                                  "uid": np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)})
        return out.union(info.repeat_interleave(sampling["n"]))

    def compute_reward(self, batch: Batch, metrics: dict) -> None:
        from rlx.data.reward import mean_extras

        scores, extra = self.reward_fn(batch)
        batch.tensors["token_level_scores"] = scores
        metrics.update({f"reward_extra/{k}": v for k, v in mean_extras(extra).items()})

    def compute_advantage(self, batch: Batch, metrics: dict) -> None:
        alg = self.cfg.algorithm
        mask = batch["response_mask"].float()
        rewards = batch["token_level_scores"]
        if alg.use_kl_in_reward:
            rewards, kl_metrics = core_algos.apply_kl_penalty(rewards, batch["old_log_probs"], batch["ref_log_prob"],
                                                              mask, self.kl_ctrl, alg.kl_penalty)
            metrics.update(kl_metrics)
        batch.tensors["token_level_rewards"] = rewards
        adv, ret = core_algos.compute_advantage(alg.adv_estimator, token_level_rewards=rewards, response_mask=mask,
                                                values=batch.tensors.get("values"), index=batch["uid"],
                                                gamma=alg.gamma, lam=alg.lam,
                                                norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)
        batch.tensors["advantages"], batch.tensors["returns"] = adv, ret

    def validate(self) -> dict:
        """Greedy (by default) generation over the validation set: val/<data_source>/reward/mean (+ mean@n)."""
        per_source: dict[str, list[float]] = {}
        n = self.cfg.actor_rollout_ref.rollout.val_kwargs.n
        start = time.perf_counter()
        for prompts in self.val_loader:
            batch = self.generate(prompts, validate=True)
            scores, _ = self.reward_fn(batch)
            for src, s in zip(batch["data_source"], scores.sum(-1).tolist()):
                per_source.setdefault(str(src), []).append(s)
        out = {}
        for src, vals in per_source.items():
            out[f"val/{src}/reward/mean"] = float(np.mean(vals))
            if n > 1:
                out[f"val/{src}/reward/mean@{n}"] = float(np.mean(vals))
        out["timing_s/testing"] = time.perf_counter() - start
        self.val_history.append(out)
        return out

    # ---- checkpoints ----------------------------------------------------------------------------------
    def _ckpt_root(self) -> str:
        return os.path.abspath(self.cfg.trainer.default_local_dir)

    def save_checkpoint(self) -> None:
        """Every part first, then the COMPLETE marker, then the latest pointer: a crash never leaves a pointer
        to a partial checkpoint."""
        from rlx import checkpoint as ckpt

        root, t = self._ckpt_root(), self.cfg.trainer
        d = ckpt.step_dir(root, self.global_step)
        self.actor_wg.run_all("save_checkpoint", os.path.join(d, "actor"))
        if self.critic_wg is not None:
            self.critic_wg.run_all("save_checkpoint", os.path.join(d, "critic"))
        ckpt.save_driver_state(d, {"global_step": self.global_step, "dataloader": self.train_loader.state_dict(),
                                   "kl_ctrl_value": self.kl_ctrl.value})
        ckpt.mark_complete(d)
        ckpt.write_latest(root, self.global_step)
        ckpt.rotate(root, t.max_actor_ckpt_to_keep, "actor")
        ckpt.rotate(root, t.max_critic_ckpt_to_keep, "critic")
        log.info("saved checkpoint %s", d)

    def resume(self) -> None:
        from rlx import checkpoint as ckpt

        t = self.cfg.trainer
        d = ckpt.find_resume_dir(dataclasses.replace(
            t, default_local_dir=self._ckpt_root(),
            resume_from_path=os.path.abspath(t.resume_from_path) if t.resume_from_path else None))
        if d is None:
            return
        state = ckpt.load_driver_state(d)
        self.actor_wg.run_all("load_checkpoint", os.path.join(d, "actor"))
        if self.critic_wg is not None:
            self.critic_wg.run_all("load_checkpoint", os.path.join(d, "critic"))
        self.global_step = int(state["global_step"])
        self.train_loader.load_state_dict(state["dataloader"])
        self.kl_ctrl.value = state["kl_ctrl_value"]
        log.info("resumed from %s at step %d", d, self.global_step)

    def param_checksum(self) -> float:
        return self.actor_wg.run_all("param_checksum")[0]

