"""The PPO/GRPO driver loop: a short list of named steps, each a call into a worker group or a pure function."""
from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from rlx.algos import advantages, core_algos
from rlx.algos.metrics import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics
from rlx.algos.probs_diff import rollout_probs_diff
from rlx.config.schema import RLXConfig
from rlx.plan import ACTOR_GROUP, CRITIC_GROUP, REWARD_MODEL_GROUP, JobPlan
from rlx.protocol import Batch
from rlx.trainer.phases import LaunchTiming
from rlx.trainer.profiling import StepProfiling
from rlx.trainer.stopping import SkippedStepGuard, TrainingStopped
from rlx.trainer.dynamic_sampling import DynamicSampling, NotEnoughGroups
from rlx.trainer.tracking import Tracker

if TYPE_CHECKING:
    from rlx.trainer.preflight import DriverInputs
    from rlx.workers.actor_worker import ActorGroup
    from rlx.workers.critic_worker import CriticGroup
    from rlx.workers.group import ResourcePool
    from rlx.workers.reward_model_worker import RewardModelGroup

log = logging.getLogger("rlx")


@contextmanager
def timed(name: str, timing: dict):
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def worker_metrics(out: Batch, metrics: dict) -> Batch:
    """Move what the workers measured during a call (`meta["metrics"]`: the rollout's phases, GPU memory after each
    phase) into the step's metrics; returns `out` without it."""
    metrics.update(out.meta.pop("metrics", {}))
    return out


class RayPPOTrainer:
    def __init__(self, cfg: RLXConfig, plan: JobPlan, inputs: DriverInputs | None = None):
        """`plan`: the job plan (`rlx.plan.make_plan(cfg)`: engines, roles, pools); `inputs`: what
        `preflight(cfg, plan)` built (tokenizer, datasets, reward function, the verified resume dir); preflight runs
        here when it is not given."""
        from rlx.data.dataset import PromptLoader
        from rlx.reward.manager import build_reward_manager
        from rlx.trainer.preflight import preflight

        start = time.perf_counter()
        self.launch = LaunchTiming()  # the launch's phases, logged with the first step (rlx.trainer.phases)
        inputs = inputs or preflight(cfg, plan)
        self.cfg, self.plan = cfg, plan
        arr, data = cfg.actor_rollout_ref, cfg.data
        self.world_size = plan.placement.pool_of(ACTOR_GROUP).world_size
        self.use_critic, self.use_ref = plan.roles.critic, plan.roles.ref
        self.tokenizer = inputs.tokenizer
        self.train_loader = PromptLoader(inputs.train_dataset, data.gen_batch_size or data.train_batch_size,
                                         shuffle=data.shuffle, seed=data.seed)
        self.dynamic_sampling = DynamicSampling(cfg.algorithm.filter_groups, data.train_batch_size, arr.rollout.n)
        pf = cfg.algorithm.pf_ppo
        pf_ppo = (pf.reweight_method, pf.weight_pow)
        self.pf_ppo = pf_ppo if cfg.algorithm.use_pf_ppo and self.use_critic else None  # verl: after GAE only
        rc = cfg.algorithm.rollout_correction
        self.old_from_rollout = rc.bypass_mode  # the rollout's log-probs are the old ones (no recompute)
        self.rollout_corr = dict(rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold,
                                 rollout_is_batch_normalize=rc.rollout_is_batch_normalize, rollout_rs=rc.rollout_rs,
                                 rollout_rs_threshold=rc.rollout_rs_threshold)
        if cfg.algorithm.use_pf_ppo and not self.use_critic:
            log.warning("algorithm.use_pf_ppo=True resamples only with adv_estimator=gae (as in verl); with %s it "
                        "does nothing", cfg.algorithm.adv_estimator)
        self.val_loader = PromptLoader(inputs.val_dataset, data.val_batch_size, shuffle=False, drop_last=False)
        self.reward_fn = build_reward_manager(cfg, self.tokenizer, inputs.score_fn)
        self.resume_dir = inputs.resume_dir
        self.skip_guard = SkippedStepGuard(cfg.trainer.max_consecutive_skipped_steps)
        t = cfg.trainer
        self.total_steps = t.total_training_steps or len(self.train_loader) * t.total_epochs
        self.kl_ctrl = core_algos.get_kl_controller(cfg.algorithm.kl_ctrl.type, cfg.algorithm.kl_ctrl.kl_coef,
                                                    cfg.algorithm.kl_ctrl.target_kl, cfg.algorithm.kl_ctrl.horizon)
        self.global_step = 0
        self.val_history: list[dict] = []
        self.actor: ActorGroup | None = None  # the worker groups, started by init_workers()
        self.critic: CriticGroup | None = None
        self.rm: RewardModelGroup | None = None
        self.history: list[dict] = []  # what fit() returned (rlx.trainer.launch keeps it here)
        self._placed: dict[str, ResourcePool] = {}  # the pools placed so far, by name (place())
        self.launch.add("trainer", time.perf_counter() - start)

    # ---- setup ----------------------------------------------------------------------------------------
    def init_workers(self) -> None:
        from rlx.workers.actor_worker import ActorGroup
        from rlx.workers.critic_worker import CriticGroup
        from rlx.workers.reward_model_worker import RewardModelGroup

        roles = self.plan.roles
        with self.launch.phase("workers"):
            self.actor = ActorGroup(self.place(ACTOR_GROUP), self.cfg, self.plan)
            self.critic = CriticGroup(self.place(CRITIC_GROUP), self.cfg, self.plan) if roles.critic else None
            self.rm = (RewardModelGroup(self.place(REWARD_MODEL_GROUP), self.cfg, self.plan) if roles.reward_model
                       else None)
        # actor (and its vLLM engine) first: vLLM sizes its KV cache from a GPU no other process is filling
        with self.launch.phase("init_actor"):
            self.launch.add("rollout_engine", self.actor.init_model(self.total_steps))
        if self.critic is not None:
            with self.launch.phase("init_critic"):
                self.critic.init_model(self.total_steps)
        if self.rm is not None:
            with self.launch.phase("init_reward_model"):
                self.rm.init_model()

    def place(self, group: str) -> ResourcePool:
        """The resource pool of worker group `group`, placed when the first group of its pool starts: the plan's
        pools (verl's colocated layout: one bundle per GPU, rank i of every group of a pool on its bundle i, see
        rlx.workers.group; the reward model's own pool with reward_model.enable_resource_pool; the rollout's with
        actor_rollout_ref.hybrid_engine=False)."""
        from rlx.workers.group import ResourcePool

        placement = self.plan.placement
        name = placement.groups[group]
        if name not in self._placed:
            p = placement.pools[name]
            self._placed[name] = ResourcePool(p.nnodes, p.gpus_per_node, placement.device,
                                              roles=placement.sharing(name), ranks_per_bundle=p.ranks_per_bundle)
        return self._placed[name]

    def shutdown(self) -> None:
        """Kill the workers and release their placement group; end the reward's scoring processes."""
        for group in (self.actor, self.critic, self.rm):
            if group is not None:
                group.shutdown()
        self.actor = self.critic = self.rm = None
        self.reward_fn.close()

    # ---- the loop -------------------------------------------------------------------------------------
    def fit(self) -> list[dict]:
        if self.actor is None:
            self.init_workers()
        log_dir = os.path.join(self.cfg.trainer.default_local_dir, "logs")
        with self.launch.phase("loggers"):
            self.tracker = Tracker(self.cfg, log_dir)
        self.profiling = StepProfiling(self.cfg.global_profiler, [self.actor, self.critic], self.total_steps)
        history: list[dict] = []
        with self.launch.phase("resume"):
            self.resume()
        self.before_training()
        if self.cfg.trainer.val_before_train or self.cfg.trainer.val_only:
            with self.launch.phase("validation"):
                self.tracker.log(self.validate(), step=self.global_step)
        if self.cfg.trainer.val_only:
            self.tracker.close()
            return history
        self.launch.first_step_starts()
        with self.stepping():
            self._steps(history)
        self.tracker.close()
        return history

    def _steps(self, history: list[dict]) -> None:
        bar = tqdm(total=self.total_steps, initial=self.global_step, desc="rlx", disable=not sys.stderr.isatty())
        while self.global_step < self.total_steps:
            self.global_step += 1
            with self.profiling.step(self.global_step):  # global_profiler.steps: the workers trace this one
                metrics = self.next_step()
                metrics.update(self.launch.metrics())  # the first step of this process: where the launch went
                if self._due(self.cfg.trainer.test_freq) or self.global_step == self.total_steps:
                    metrics.update(self.validate())
                if self._due(self.cfg.trainer.save_freq) or (self.cfg.trainer.save_freq > 0
                                                             and self.global_step == self.total_steps):
                    start = time.perf_counter()
                    self.save_checkpoint()
                    metrics["timing_s/save_checkpoint"] = time.perf_counter() - start
            self.tracker.log(metrics, step=self.global_step)
            history.append(metrics)
            self.skip_guard.stop_if_stuck(self.global_step)
            bar.set_postfix(score=f"{metrics['critic/score/mean']:.3f}", step_s=f"{metrics['timing_s/step']:.1f}")
            bar.update(1)
        bar.close()

    # the hooks a trainer with another schedule overrides (rlx.trainer.async_trainer)
    def before_training(self) -> None:
        """After the resume, before the first validation."""

    @contextmanager
    def stepping(self):
        """Around the training steps."""
        yield

    def next_step(self) -> dict:
        """The next training step's metrics (global_step is its number)."""
        return self.train_step(self.train_loader.next_batch())

    def _due(self, freq: int) -> bool:
        return freq > 0 and self.global_step % freq == 0

    def train_step(self, prompts: Batch) -> dict:
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with timed("step", timing):
            batch = self.sample(prompts, metrics, timing)
            batch = self.update(batch, metrics, timing)
        return self.step_metrics(batch, metrics, timing)

    def update(self, batch: Batch, metrics: dict, timing: dict) -> Batch:
        """Everything after the rollout: old log-probs, ref, values, advantages, then the critic's and the actor's
        updates; returns the batch as trained on."""
        batch = self.balance_batch(batch, metrics)
        assert self.actor is not None  # init_workers ran
        if self.old_from_rollout:  # bypass mode (or async_training.use_rollout_log_probs): no old log-prob pass
            batch.tensors["old_log_probs"] = batch["rollout_log_probs"]
        else:
            with timed("old_log_prob", timing):
                batch = batch.union(worker_metrics(self.actor.compute_log_prob(batch), metrics))
        if "rollout_log_probs" in batch and not self.old_from_rollout:
            metrics.update(rollout_probs_diff(batch["rollout_log_probs"], batch["old_log_probs"],
                                              batch["response_mask"]))
        if self.use_ref:
            with timed("ref", timing):
                batch = batch.union(worker_metrics(self.actor.compute_ref_log_prob(batch), metrics))
        if self.use_critic:
            assert self.critic is not None  # use_critic: init_workers built it
            with timed("values", timing):
                batch = batch.union(worker_metrics(self.critic.compute_values(batch), metrics))
        with timed("adv", timing):
            self.compute_advantage(batch, metrics)
        batch = self.pf_ppo_resample(batch)
        if self.use_critic:
            assert self.critic is not None  # use_critic: init_workers built it
            with timed("update_critic", timing):
                metrics.update(self.critic.update(batch))
        if self.global_step > self.cfg.trainer.critic_warmup:
            with timed("update_actor", timing):
                metrics.update(self.actor.update(batch))
        return batch

    def step_metrics(self, batch: Batch, metrics: dict, timing: dict) -> dict:
        """The step's metrics: data, timing, memory, throughput (tokens / s / GPU of every pool), skipped steps; and
        the step's rollouts to trainer.rollout_data_dir."""
        metrics.update(compute_data_metrics(batch.tensors, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(timing))
        for stat in ("max_memory_allocated_gb", "max_memory_reserved_gb", "cpu_memory_used_gb"):
            phases = [v for k, v in metrics.items() if k.startswith("perf/update_") and k.endswith(stat)]
            if phases:
                metrics[f"perf/{stat}"] = max(phases)
        n_gpus = self.plan.placement.bundles
        metrics.update(compute_throughput_metrics(int(batch["attention_mask"].sum()), timing["step"], n_gpus))
        self.skip_guard.count(metrics, self.global_step)
        if self.cfg.trainer.rollout_data_dir:  # verl's: the step's rollouts as JSONL, after the update
            from rlx.trainer.generations import dump_batch

            extras = {k[len("reward_extra/"):]: v for k, v in batch.non_tensors.items() if k.startswith("reward_extra/")}
            dump_batch(self.cfg.trainer.rollout_data_dir, self.global_step, batch, self.tokenizer, extras)
        return metrics

    # ---- steps ----------------------------------------------------------------------------------------
    def sample(self, prompts: Batch, metrics: dict, timing: dict, step: int | None = None,
               generated: Batch | None = None) -> Batch:
        """The step's training batch: `prompts` generated and scored, and with `algorithm.filter_groups` the kept
        groups of as many further rounds as it takes (`rlx.trainer.dynamic_sampling`). `generated`: the responses
        to `prompts`, when they were generated already (`generate`)."""
        try:
            return self.dynamic_sampling.fill(self.rollout(prompts, metrics, timing, step, generated),
                                              lambda: self.rollout(self.train_loader.next_batch(), metrics, timing,
                                                                   step),
                                              metrics)
        except NotEnoughGroups as e:
            raise TrainingStopped(f"step {self.global_step}: {e}") from None

    def rollout(self, prompts: Batch, metrics: dict, timing: dict, step: int | None = None,
                generated: Batch | None = None) -> tuple[Batch, dict]:
        """Generate and score one round of prompts: the batch (with token_level_scores) and the reward extras.
        `step`: the training step the batch is for (sampling seed; default: the current one); `generated`: the
        responses, when they were generated already."""
        with timed("gen", timing):
            out = generated if generated is not None else self.generate(prompts, validate=False, step=step)
            batch = worker_metrics(out, metrics)
        if self.cfg.algorithm.adv_estimator == "remax":
            with timed("gen_baseline", timing):
                self.greedy_baseline(prompts, batch, metrics)
        with timed("reward", timing):
            extra = self.compute_reward(batch, metrics)
        return batch, extra

    def generate(self, prompts: Batch, validate: bool, greedy: bool = False, step: int | None = None) -> Batch:
        """Rollout on the actor workers; returns rows repeated n times with prompt fields and group uids.
        `greedy`: one greedy response per prompt (ReMax's baseline); `step`: the training step whose seed samples
        (default: the current one)."""
        r = self.cfg.actor_rollout_ref.rollout
        vk = r.val_kwargs
        sampling = (dict(n=vk.n, do_sample=vk.do_sample, temperature=vk.temperature, top_p=vk.top_p, top_k=vk.top_k)
                    if validate else
                    dict(n=r.n, do_sample=r.do_sample, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k))
        if greedy:
            sampling.update(n=1, do_sample=False)
        # the agent loop (rollout.mode=async) also reads each row's chat, extra_info (tools_kwargs) and agent_name
        gen_in = prompts.select("input_ids", "attention_mask", "position_ids", "raw_chat", "extra_info", "agent_name")
        gen_in.meta = dict(sampling, seed=r.seed + (self.global_step if step is None else step))
        out = self.engine_generate(gen_in, validate)
        info = Batch(non_tensors={**prompts.non_tensors,
                                  "uid": np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)})
        return out.union(info.repeat_interleave(int(sampling["n"])))

    def engine_generate(self, gen_in: Batch, validate: bool) -> Batch:
        """The engines' responses to `gen_in`: the actor workers' colocated engines."""
        assert self.actor is not None  # init_workers ran
        return self.actor.generate(gen_in)

    def greedy_baseline(self, prompts: Batch, batch: Batch, metrics: dict) -> None:
        """ReMax: the reward of one greedy response per prompt, generated by the same engine, on each of the prompt's
        rows as `reward_baselines` (verl's)."""
        greedy = worker_metrics(self.generate(prompts, validate=False, greedy=True), {})
        scores, _ = self.score(greedy)
        n = len(batch) // len(prompts)
        batch.tensors["reward_baselines"] = scores.sum(dim=-1).repeat_interleave(n)
        metrics["critic/reward_baseline/mean"] = float(scores.sum(dim=-1).mean())

    def balance_batch(self, batch: Batch, metrics: dict) -> Batch:
        """`trainer.balance_batch` (verl's): reorder rows so that each data-parallel rank's equal share holds about
        the same number of tokens; logs global_seqlen/* (before: min/max/minmax_diff over ranks; balanced_*)."""
        if not self.cfg.trainer.balance_batch:
            return batch
        from rlx.engine.packing import equal_size_partition, seq_lens

        lengths = seq_lens(batch).tolist()
        groups = equal_size_partition(lengths, self.world_size)
        step = len(lengths) // self.world_size
        before = [sum(lengths[r * step:(r + 1) * step]) for r in range(self.world_size)]
        after = [sum(lengths[i] for i in g) for g in groups]
        metrics.update({"global_seqlen/min": min(before), "global_seqlen/max": max(before),
                        "global_seqlen/minmax_diff": max(before) - min(before),
                        "global_seqlen/balanced_min": min(after), "global_seqlen/balanced_max": max(after),
                        "global_seqlen/mean": sum(lengths) / self.world_size})
        return batch.index([i for g in groups for i in g])

    def compute_reward(self, batch: Batch, metrics: dict) -> dict:
        """token_level_scores into the batch; returns the score function's extra values (one list per key)."""
        from rlx.reward.manager import mean_extras

        scores, extra = self.score(batch, metrics)
        batch.tensors["token_level_scores"] = scores
        if self.cfg.trainer.rollout_data_dir:  # the extras travel with their rows (dynamic sampling drops some)
            for key, values in extra.items():
                if len(values) == len(batch):
                    batch.non_tensors[f"reward_extra/{key}"] = np.asarray(list(values), dtype=object)
        for key in self.cfg.algorithm.gdpo_reward_keys or []:  # gdpo's reward components, one score per row
            if key not in extra:
                raise TrainingStopped(f"step {self.global_step}: algorithm.gdpo_reward_keys names {key!r}, but the "
                                      f"reward function's dict has no such key (it has {sorted(extra)}); return it "
                                      f"from the reward function, or fix algorithm.gdpo_reward_keys")
            batch.non_tensors[key] = np.asarray(extra[key], dtype=np.float32)
        metrics.update({f"reward_extra/{k}": v for k, v in mean_extras(extra).items()})
        if self.cfg.reward_model.non_finite_score is not None:
            metrics["reward/non_finite_count"] = float(self.reward_fn.non_finite_count)
        if self.reward_fn.in_pool:  # calls past reward_model.score_timeout_s, scored reward_model.timeout_score
            metrics["reward/timeouts"] = float(self.reward_fn.timeouts)
        return extra

    def score(self, batch: Batch, metrics: dict | None = None):
        """Token-level scores of a generated batch and the reward function's extra values (rlx.reward.score's
        score_batch: the reward model's, else the reward manager's); a reward that is not a finite number stops the
        run."""
        from rlx.reward.manager import RewardError
        from rlx.reward.score import score_batch

        out = None
        if self.rm is not None:
            out = worker_metrics(self.rm.compute_rm_score(batch), metrics if metrics is not None else {})
        try:
            return score_batch(batch, self.reward_fn, out, custom_function=bool(self.cfg.custom_reward_function.path))
        except RewardError as e:
            raise TrainingStopped(f"step {self.global_step}: {e}") from None

    def compute_advantage(self, batch: Batch, metrics: dict) -> None:
        alg = self.cfg.algorithm
        mask = batch["response_mask"].float()
        rewards = batch["token_level_scores"]
        if alg.use_kl_in_reward:
            rewards, kl_metrics = core_algos.apply_kl_penalty(rewards, batch["old_log_probs"], batch["ref_log_prob"],
                                                              mask, self.kl_ctrl, alg.kl_penalty)
            metrics.update(kl_metrics)
        batch.tensors["token_level_rewards"] = rewards
        mask = self.correct_rollout(batch, metrics)  # verl: after the KL penalty, before the advantages
        components = [torch.as_tensor(np.asarray(batch[k], dtype=np.float32)) for k in alg.gdpo_reward_keys or []]
        adv, ret = advantages.compute_advantage(
            alg.adv_estimator, token_level_rewards=rewards, response_mask=mask, values=batch.tensors.get("values"),
            index=batch["uid"], gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
            reward_baselines=batch.tensors.get("reward_baselines"), old_log_probs=batch["old_log_probs"],
            sum_pi_squared=batch.tensors.get("sum_pi_squared"),
            rollout_is_weights=batch.tensors.get("rollout_is_weights"),
            reward_components=components or None,
            reward_weights=alg.gdpo_reward_weights)
        batch.tensors["advantages"], batch.tensors["returns"] = adv, ret

    def correct_rollout(self, batch: Batch, metrics: dict) -> torch.Tensor:
        """`algorithm.rollout_correction` (verl's decoupled mode), when the rollout returned its log-probs: importance
        weights `rollout_is_weights` for the policy loss, rejected tokens out of `response_mask`, `rollout_corr/*`
        metrics. Returns the response mask (float) the advantages use."""
        if "rollout_log_probs" in batch and not self.old_from_rollout:  # bypass mode corrects in the actor's loss
            from rlx.algos.rollout_correction import rollout_correction

            weights, mask, corr_metrics = rollout_correction(batch["old_log_probs"], batch["rollout_log_probs"],
                                                             batch["response_mask"], **self.rollout_corr)
            batch.tensors["response_mask"] = mask
            if weights is not None:
                batch.tensors["rollout_is_weights"] = weights
            metrics.update(corr_metrics)
        return batch["response_mask"].float()

    def pf_ppo_resample(self, batch: Batch) -> Batch:
        """`algorithm.use_pf_ppo` (verl's, after GAE only): the batch drawn again, with replacement, each response
        with probability proportional to its PF-PPO weight."""
        if self.pf_ppo is None:
            return batch
        from rlx.algos.pf_ppo import resample_indices

        return batch.index(resample_indices(batch["token_level_scores"].sum(-1), *self.pf_ppo))

    def validate(self) -> dict:
        """One validation (rlx.trainer.validation.validate): its metrics, also kept in val_history."""
        from rlx.trainer.validation import validate

        out = validate(self)
        self.val_history.append(out)
        return out

    # ---- checkpoints ----------------------------------------------------------------------------------
    def _checkpointed(self) -> dict:
        """The worker groups a checkpoint holds, by their folder in the step's."""
        return {"actor": self.actor, **({"critic": self.critic} if self.critic is not None else {})}

    def save_checkpoint(self) -> None:
        """Save this step (`CheckpointSaveError` when the disk refuses it: full, read-only, another OSError)."""
        from rlx.checkpoint.manager import CheckpointManager

        CheckpointManager(self.cfg.trainer, self._checkpoint_estimate).save(
            self.global_step, self._checkpointed(),
            {"global_step": self.global_step, "dataloader": self.loader_state(), "kl_ctrl_value": self.kl_ctrl.value})

    def _checkpoint_estimate(self) -> int:
        from rlx.checkpoint import space

        try:
            return space.estimate(self.cfg, self.plan).total
        except Exception:  # noqa: BLE001 - the line names the free space either way
            return 0

    def loader_state(self) -> dict:
        """The data loader's position after the last trained batch (saved with a checkpoint)."""
        return self.train_loader.state_dict()

    def resume(self) -> None:
        """From `resume_dir`, chosen and verified against its checksums by the preflight (None: a fresh start)."""
        from rlx.checkpoint.manager import CheckpointManager

        state = CheckpointManager(self.cfg.trainer).resume(self.resume_dir, self._checkpointed())
        if state is not None:
            self.global_step = int(state["global_step"])
            self.train_loader.load_state_dict(state["dataloader"])
            self.kl_ctrl.value = state["kl_ctrl_value"]

    def param_checksum(self) -> float:
        assert self.actor is not None  # init_workers ran
        return self.actor.param_checksum()

