"""The actor worker: policy training (FSDP), rollout (vLLM or HF) and the reference policy in one process; and
`ActorGroup`, the driver's typed handle on all its ranks."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rlx.config.schema import RLXConfig
from rlx.plan import JobPlan
from rlx.protocol import Batch
from rlx.workers.base_worker import Worker
from rlx.workers.group import ResourcePool, WorkerGroup
from rlx.workers.profiling import profiled

if TYPE_CHECKING:
    from rlx.workers.weight_transfer import WeightTransfer

log = logging.getLogger("rlx")


class ActorRolloutRefWorker(Worker):
    NAME = "actor_rollout_ref"

    def profiler_roles(self) -> dict:
        arr = self.cfg.actor_rollout_ref
        roles = {"actor": arr.actor.profiler, "rollout": arr.rollout.profiler}
        if self.plan.roles.ref:  # a ref phase runs
            roles["ref"] = arr.ref.profiler
        return roles

    def process_group_timeout_s(self) -> float:
        return self.cfg.actor_rollout_ref.nccl_timeout

    def init_model(self, total_steps: int) -> float:
        """Build the actor (and the ref, and the rollout engine when colocated); returns the seconds the rollout
        engine took to build (0 without one)."""
        import time

        from rlx.engine.actor import ActorEngine
        from rlx.engine.base import role_micro_batch_tokens
        from rlx.engine.lora import lora_enabled

        arr = self.cfg.actor_rollout_ref
        assert self.device is not None  # init_distributed ran
        common: dict[str, Any]
        common = dict(model_cfg=arr.model, device=self.device, world_size=self.world_size,
                      rollout_n=arr.rollout.n, temperature=arr.rollout.temperature)
        rc = self.cfg.algorithm.rollout_correction
        bypass = dict(loss_type=rc.loss_type, correction=dict(  # the loss of rollout_correction.bypass_mode
            rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold,
            rollout_is_batch_normalize=rc.rollout_is_batch_normalize, rollout_rs=rc.rollout_rs,
            rollout_rs_threshold=rc.rollout_rs_threshold))
        self.actor = ActorEngine(role="actor", actor_cfg=arr.actor, fsdp_cfg=arr.actor.fsdp_config,
                                 strategy=arr.actor.strategy, total_steps=total_steps,
                                 bypass=bypass if rc.bypass_mode else None,
                                 sp_size=arr.actor.ulysses_sequence_parallel_size,
                                 max_micro_batch_tokens=role_micro_batch_tokens(self.cfg.data, arr.actor),
                                 **common)
        self.ref = None
        # with LoRA the ref is the actor's own module with its adapters switched off (verl): no second model
        if self.plan.roles.ref and not lora_enabled(arr.model):
            self.ref = ActorEngine(role="ref", actor_cfg=arr.actor, fsdp_cfg=arr.ref.fsdp_config,
                                   strategy=arr.ref.strategy, sp_size=arr.ref.ulysses_sequence_parallel_size,
                                   entropy_cfg=arr.ref, **common)
        if self.plan.rollout.disaggregated:  # the engines live in the rollout workers (rlx.workers.rollout_worker)
            from rlx.workers.rollout import build_tokenizer

            self.rollout, self.agent, self.tokenizer = None, None, build_tokenizer(self.cfg)
            self.transfer: WeightTransfer | None = None
            return 0.0
        start = time.perf_counter()
        self.rollout = self._build_rollout(self.plan.rollout.engine)
        self.agent = self._build_agent_rollout()
        return time.perf_counter() - start

    def _build_rollout(self, engine: str):
        """This rank's rollout engine (`engine`: the plan's, vllm | hf) and the tokenizer."""
        from rlx.workers.rollout import build_rank_engine

        rollout, self.tokenizer = build_rank_engine(self.cfg, engine, self.device, self.rank, self.world_size)
        return rollout

    def _build_agent_rollout(self):
        """The agent loop over this rank's engine (rollout.mode=async or multi_turn.enable), else None."""
        from rlx.workers.rollout import build_agent_rollout

        return build_agent_rollout(self.cfg, self.plan, self.rollout, self.tokenizer)

    # ---- the steps the driver calls ----------------------------------------------------------------------
    @profiled("rollout_generate", role="rollout")
    def generate_sequences(self, prompts: Batch) -> Batch:
        """Sync the FSDP weights into the rollout engine, generate, free the engine's cache. The result's
        `meta["metrics"]` holds the rollout's phases: `timing_s/rollout/{wake,sync,generate,sleep}`,
        `perf/rollout/generated_tokens_per_s` (this rank's) and the GPU memory after each phase."""
        arr_rollout = self.cfg.actor_rollout_ref.rollout
        assert self.rollout is not None  # the hybrid engine's: this worker's own
        m: dict = {}
        # vLLM sleep mode, in stages (verl's order with vLLM, rollout.multi_stage_wake_up or not): the weights, the
        # sync, then the KV cache once the gathered weights are freed
        with self.measured("wake", m, "rollout/wake"):
            self.rollout.wake_up("weights")
        with self.measured("sync", m, "rollout/sync"):
            # merged base + adapter weights with LoRA (plain HF names); layered_summon: one FSDP unit at a time
            with self.actor.phase():
                self.rollout.sync_weights(self.actor.policy_weights(layered=arr_rollout.layered_summon))
        with self.measured("wake", m, "rollout/wake"):  # the KV cache once the FSDP shards left (param offload)
            self.rollout.wake_up("kv_cache")
        from rlx.workers.rollout import rank_seed

        prompts.meta = dict(prompts.meta, seed=rank_seed(self.plan.rollout.engine, int(prompts.meta.get("seed", 0)),
                                                         self.rank))
        with self.measured("generate", m, "rollout/generate"):
            out = (self.agent if self.agent is not None else self.rollout).generate_sequences(prompts)
        m.update(out.meta.pop("agent_metrics", {}))
        with self.measured("sleep", m, "rollout/sleep"):
            self.rollout.release()
        m["perf/rollout/generated_tokens_per_s"] = float(out["response_mask"].sum()) / max(
            m["timing_s/rollout/generate"], 1e-9)
        out.meta = dict(out.meta, metrics=m)
        return out

    @profiled("actor_compute_log_prob", role="actor")
    def compute_log_prob(self, batch: Batch) -> Batch:
        r = self.cfg.actor_rollout_ref.rollout
        spsq = self.cfg.actor_rollout_ref.actor.calculate_sum_pi_squared
        m: dict = {}
        with self.measured("old_log_prob", m, "worker/old_log_prob"):
            out = self.actor.compute_log_prob(batch, r.log_prob_micro_batch_size_per_gpu, with_entropy=False,
                                              max_token_len=r.log_prob_max_token_len_per_gpu
                                              if r.log_prob_use_dynamic_bsz else None, with_sum_pi_squared=spsq)
        extra = {"sum_pi_squared": out["sum_pi_squared"]} if spsq else {}
        return Batch({"old_log_probs": out["log_probs"], **extra}, meta={"metrics": m})

    @profiled("ref_compute_log_prob", role="ref")
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        assert self.plan.roles.ref, "ref model requested but no KL term is configured"
        r = self.cfg.actor_rollout_ref.ref
        engine = self.ref if self.ref is not None else self.actor  # with LoRA: the actor, adapters off
        m: dict = {}
        with self.measured("ref", m), engine.adapters_disabled():
            out = engine.compute_log_prob(batch, r.log_prob_micro_batch_size_per_gpu,
                                          max_token_len=r.log_prob_max_token_len_per_gpu
                                          if r.log_prob_use_dynamic_bsz else None)
        return Batch({"ref_log_prob": out["log_probs"]}, meta={"metrics": m})

    @profiled("actor_update", role="actor")
    def update_actor(self, batch: Batch) -> dict:
        m: dict = {}
        with self.measured("update_actor", m, "worker/update_actor"):
            out = self.actor.update_policy(batch)
        return {**out, **m}

    def save_checkpoint(self, path: str) -> None:
        """Sharded actor checkpoint, with an HF-format export (from_pretrained, vLLM) when `checkpoint.save_contents`
        has hf_model. The ref is not saved."""
        from rlx.checkpoint.engine_state import save_engine

        model = self.cfg.actor_rollout_ref.model
        save_engine(self.actor, path, contents=self.cfg.actor_rollout_ref.actor.checkpoint.save_contents,
                    tokenizer=self.tokenizer if model.custom_chat_template else None)

    def load_checkpoint(self, path: str) -> None:
        from rlx.checkpoint.engine_state import load_engine

        load_engine(self.actor, path, contents=self.cfg.actor_rollout_ref.actor.checkpoint.load_contents)

    # ---- weights to the rollout pool (actor_rollout_ref.hybrid_engine=False) -----------------------------------
    def weights_info(self, dtype: str, bucket_bytes: int):
        """Every rank gathers the policy's full weights once (collective); rank 0 returns their names and shapes
        (rlx.workers.weight_transfer.WeightsInfo), the others None."""
        from rlx.workers.weight_transfer import WeightsInfo

        names, shapes = [], []
        with self.actor.phase():
            for name, tensor in self.actor.policy_weights(layered=self.cfg.actor_rollout_ref.rollout.layered_summon):
                names.append(name)
                shapes.append(tuple(tensor.shape))
        return WeightsInfo(tuple(names), tuple(shapes), dtype, bucket_bytes) if self.rank == 0 else None

    def open_weight_transfer(self, host: str, groups: list[tuple[int, int]]) -> None:
        """Rank 0: the source end of the trainer -> rollout groups ((port, world size) each; the rollout ranks join
        as 1..)."""
        if self.rank == 0:
            from rlx.workers.weight_transfer import WeightTransfer

            assert self.device is not None  # init_distributed ran
            self.transfer = WeightTransfer(host, groups, 0, self.device, self.cfg.actor_rollout_ref.nccl_timeout)

    def send_weights(self, info) -> dict:
        """Every rank gathers the full weights (collective); rank 0 broadcasts them to the rollout ranks. Returns
        rank 0's `{bytes, seconds}` (the others: {})."""
        with self.actor.phase():
            named = self.actor.policy_weights(layered=self.cfg.actor_rollout_ref.rollout.layered_summon)
            if self.rank == 0:
                assert self.transfer is not None  # rank 0 opened it
                return self.transfer.send(info, named)
            for _ in named:
                pass
        return {}

    def param_checksum(self) -> float:
        """Sum of squares of all actor weights (collective): lets tests see that training changed them."""
        with self.actor.phase():
            return float(sum(t.double().pow(2).sum() for _, t in self.actor.policy_weights()))


class ActorGroup(WorkerGroup):
    """The actor/rollout/ref ranks, as the driver calls them (each call runs on every rank)."""

    def __init__(self, pool: ResourcePool, cfg: RLXConfig, plan: JobPlan):
        super().__init__(ActorRolloutRefWorker, pool, cfg, plan)
        # Ulysses: the ranks of a sequence-parallel group get the same rows (the rollout is not affected)
        self.sp = cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size
        self.ref_sp = cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size
        self.rollout_tp = plan.rollout.tensor_parallel_size

    def init_model(self, total_steps: int) -> float:
        """Build every rank's models; returns the seconds the slowest rank's rollout engine took to build."""
        return max(self.run_all(ActorRolloutRefWorker.init_model, total_steps))

    def generate(self, prompts: Batch) -> Batch:
        """Responses to `prompts` (split over the rollout's data-parallel groups: runs of the plan's
        rollout.tensor_parallel_size ranks generate together)."""
        return self.run_dp(ActorRolloutRefWorker.generate_sequences, prompts, replicas=self.rollout_tp)

    def compute_log_prob(self, batch: Batch) -> Batch:
        """`old_log_probs` of the responses under the current policy."""
        return self.run_dp(ActorRolloutRefWorker.compute_log_prob, batch, replicas=self.sp)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """`ref_log_prob` of the responses under the reference policy."""
        return self.run_dp(ActorRolloutRefWorker.compute_ref_log_prob, batch, replicas=self.ref_sp)

    def update(self, batch: Batch) -> dict:
        """One PPO update of the policy on `batch`; the `actor/*` metrics (memory figures: max over ranks)."""
        return self.run_dp_metrics(ActorRolloutRefWorker.update_actor, batch, replicas=self.sp)

    def save(self, path: str) -> None:
        self.run_all(ActorRolloutRefWorker.save_checkpoint, path)

    def load(self, path: str) -> None:
        self.run_all(ActorRolloutRefWorker.load_checkpoint, path)

    def param_checksum(self) -> float:
        return self.run_all(ActorRolloutRefWorker.param_checksum)[0]

    # ---- weights to the rollout pool ---------------------------------------------------------------------------
    def weights_info(self, dtype: str, bucket_bytes: int):
        """The policy's weight names and shapes, as the rollout receives them in `dtype`."""
        return self.run_all(ActorRolloutRefWorker.weights_info, dtype, bucket_bytes)[0]

    def transfer_addresses(self, groups: int) -> tuple[str, list[int]]:
        """Where the trainer -> rollout groups meet: rank 0's node and a free port there for each group."""
        import ray

        return ray.get(self.workers[0].addr_ports.remote(groups))

    def open_weight_transfer(self, host: str, groups: list[tuple[int, int]]):
        """Start joining the trainer -> rollout groups ((port, world size) each; non-blocking: the rollout ranks join
        at the same time)."""
        return [w.open_weight_transfer.remote(host, groups) for w in self.workers]

    def send_weights(self, info):
        """Start the broadcast of the weights (non-blocking); the refs give rank 0's {bytes, seconds} first."""
        return [w.send_weights.remote(info) for w in self.workers]
