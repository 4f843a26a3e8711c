"""The job plan: what a job runs, resolved once from the config.

`make_plan(cfg)` answers in one place the questions the entry point, the trainer and the workers would otherwise ask
the config again and again:

- the rollout: its engine (`rollout.name=auto` becomes vllm when vLLM is installed, else hf), how many ranks
  generate one share of the batch together, sync or async (the agent loop);
- the roles: the actor and its rollout always; the reference policy when a KL term needs it (actor.use_kl_loss or
  algorithm.use_kl_in_reward); the critic for GAE; the reward model when it scores (verl's precedence: unless a
  custom reward function is given, which a generative judge runs next to); the judge and its engine;
- the placement: resource pools by name (nodes x GPUs per node, one bundle per GPU) and the pool each worker group
  goes to. verl's colocated layout is one pool `trainer` shared by every group, plus the reward model's own pool
  with reward_model.enable_resource_pool. A disaggregated rollout (actor_rollout_ref.hybrid_engine=False) is one more
  pool, `rollout`, with the rollout workers' group mapped to it, and `async_` says how far it runs ahead.

It is built on the driver from the validated config (trainer.device already resolved, rlx.config.device), before
Ray starts, and handed down: the trainer builds the pools and groups it names, every worker gets it with its config
(a small frozen dataclass, pickled with the worker's arguments). Validation reads the roles (`plan_roles`), which
are a pure function of the config, valid on any config. Whether vLLM is installed is asked through one function,
`vllm_installed`, passed in (tests stand it in).

The engine names ("vllm", "hf") are compared here, in rlx.config.roles and in the rollout factory only; the role
predicates are written in rlx.config.roles only (tests/unit/test_plan.py checks both).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, cast

from rlx.config.agent import uses_agent_loop
from rlx.config.async_training import uses_rollout_log_probs
from rlx.config.device import vllm_available
from rlx.config.roles import ENGINES, HF, VLLM, Engine, Roles, plan_roles, reward_model_pool, vllm_missing
from rlx.config.schema import RLXConfig

__all__ = ["ENGINES", "HF", "VLLM", "Engine", "Roles", "JobPlan", "make_plan", "plan_roles", "reward_model_pool",
           "vllm_missing"]


# worker groups (their Worker.NAME) and pools
ACTOR_GROUP = "actor_rollout_ref"
CRITIC_GROUP = "critic"
REWARD_MODEL_GROUP = "reward_model"
ROLLOUT_GROUP = "rollout"
TRAINER_POOL = "trainer"
REWARD_MODEL_POOL = "reward_model"
ROLLOUT_POOL = "rollout"


@dataclass(frozen=True)
class RolloutPlan:
    """How the actor's rollout generates."""
    engine: Engine
    """vllm (an in-process vLLM engine per rank, weights synced from FSDP) or hf (HF generate on a plain copy of the
    policy). actor_rollout_ref.rollout.name=auto becomes vllm when vLLM is installed, else hf."""
    tensor_parallel_size: int
    """Ranks that generate one share of the batch together: rollout.tensor_model_parallel_size with vLLM; 1 with hf
    (every rank generates its own share)."""
    mode: Literal["sync", "async"]
    """actor_rollout_ref.rollout.mode: sync (one batched generate call) or async (verl's agent loop)."""
    agent_loop: bool
    """The agent loop runs the rollout (mode=async, or rollout.multi_turn.enable)."""
    note: str | None = None
    """Why the engine is not the one asked for (rollout.name=auto without vLLM), said once when the job starts."""
    disaggregated: bool = False
    """The engines run in rollout workers on the `rollout` pool (actor_rollout_ref.hybrid_engine=False), not in
    the actor's worker; weights go from the trainer pool to them over a process group spanning both."""

    @property
    def continuous_batching(self) -> bool:
        """The engine batches requests continuously (vLLM: a request joins or leaves at any engine step, at most
        rollout.max_num_seqs at once); HF generate runs each call's batch to its end."""
        return self.engine == VLLM


@dataclass(frozen=True)
class AsyncPlan:
    """How the disaggregated rollout runs ahead of the trainer (rlx.config.async_training)."""
    staleness: int
    """The bound in policy versions (and batches generated ahead): ceil(async_training.staleness_threshold)."""
    sync_every: int
    """Training steps per weight sync (async_training.trigger_parameter_sync_step): one policy version."""
    partial_rollout: bool
    """Generation in flight pauses at a sync and goes on with the new weights (segments of `segment` tokens)."""
    segment: int
    """Tokens per generation segment with partial_rollout."""
    bucket_bytes: int
    """The weight transfer's bucket size (async_training.bucket_mb)."""
    rollout_log_probs_as_old: bool
    """The rollout's log-probs are the old log-probs (bypass); else the trainer recomputes them."""
    default_is_correction: bool
    """Token-level truncated importance sampling is switched on because the rollout lags (staleness > 0) and
    algorithm.rollout_correction.rollout_is was not set."""


@dataclass(frozen=True)
class JudgePlan:
    """How the generative judge (reward_model.judge.enable) generates its verdicts."""
    engine: Engine
    """reward_model.rollout.name, else the rollout's engine."""
    tensor_parallel_size: int
    """Ranks that judge one share of the batch together: reward_model.rollout.tensor_model_parallel_size (null: 1)
    with vLLM; 1 with hf."""




@dataclass(frozen=True)
class Pool:
    """A set of bundles (one per GPU; with trainer.device=cpu one per CPU worker slot) reserved together."""
    nnodes: int
    """Nodes of the pool."""
    gpus_per_node: int
    """Bundles per node."""
    ranks_per_bundle: int = 1
    """Ranks of one worker group on each bundle (rollout.engines_per_gpu on the rollout pool; 1 elsewhere)."""

    @property
    def bundles(self) -> int:
        """Its bundles (GPUs, or CPU worker slots)."""
        return self.nnodes * self.gpus_per_node

    @property
    def world_size(self) -> int:
        """The ranks of each worker group placed on it: ranks_per_bundle per bundle."""
        return self.bundles * self.ranks_per_bundle


@dataclass(frozen=True)
class Placement:
    """Where the worker groups' ranks go: rank i of every group of a pool on the pool's bundle i."""
    device: Literal["cuda", "cpu"]
    """trainer.device, resolved: each bundle holds a GPU (cuda) or a CPU slot (cpu)."""
    pools: dict[str, Pool]
    """Pools by name: `trainer` (trainer.nnodes x trainer.n_gpus_per_node, shared by the colocated groups), and
    `reward_model` with reward_model.enable_resource_pool (reward_model.nnodes x reward_model.n_gpus_per_node)."""
    groups: dict[str, str]
    """Each worker group the job starts (actor_rollout_ref, critic, reward_model) -> the name of its pool."""

    def pool_of(self, group: str) -> Pool:
        return self.pools[self.groups[group]]

    def sharing(self, pool: str) -> int:
        """How many worker groups share each bundle of `pool` (each takes that fraction of its GPU and CPU)."""
        return sum(1 for p in self.groups.values() if p == pool)

    @property
    def bundles(self) -> int:
        """Bundles of all pools together (a local Ray on CPU declares at least that many CPUs)."""
        return sum(p.bundles for p in self.pools.values())


@dataclass(frozen=True)
class JobPlan:
    """What a job runs, resolved once from the config (`make_plan`)."""
    rollout: RolloutPlan
    """The actor's rollout: engine, tensor parallelism, mode."""
    roles: Roles
    """Which roles are built."""
    judge: JudgePlan | None
    """The judge's engine when roles.judge, else None."""
    placement: Placement
    """Pools and the pool of each worker group."""
    async_: AsyncPlan | None = None
    """The overlap of rollout and training when the rollout has GPUs of its own (rollout.disaggregated), else None."""

    @property
    def uses_vllm(self) -> bool:
        """Some engine of the job is vLLM (the rollout's or the judge's)."""
        return self.rollout.engine == VLLM or (self.judge is not None and self.judge.engine == VLLM)








# ---------------------------------------------------------------------------------------------- engines



def resolve_engine(name: str, vllm_installed: Callable[[], bool] = vllm_available) -> tuple[Engine, str | None]:
    """The engine rollout.name=`name` runs, and a note when auto fell back to hf. A name rlx refuses (sglang, trtllm:
    a config error of its own, with its fix) is planned as auto, so that `--check` still runs the rest of the
    preflight and shows every problem at once."""
    if name in ENGINES:
        return name, None  # type: ignore[return-value]
    if vllm_installed():
        return VLLM, None
    return HF, ("vLLM is not installed, so actor_rollout_ref.rollout.name=auto runs hf (install vLLM with "
                "scripts/setup.sh for the fast rollout)")


def _tp(engine: Engine, size: int | None) -> int:
    return int(size or 1) if engine == VLLM else 1


# ---------------------------------------------------------------------------------------------- the plan
def make_plan(cfg: RLXConfig, vllm_installed: Callable[[], bool] = vllm_available) -> JobPlan:
    """The plan of a validated config (trainer.device resolved)."""
    r, t = cfg.actor_rollout_ref.rollout, cfg.trainer
    engine, note = resolve_engine(r.name, vllm_installed)
    disaggregated = not cfg.actor_rollout_ref.hybrid_engine
    rollout = RolloutPlan(engine=engine, tensor_parallel_size=_tp(engine, r.tensor_model_parallel_size),
                          mode=cast(Literal["sync", "async"], r.mode),  # validated
                          agent_loop=uses_agent_loop(r), note=note, disaggregated=disaggregated)
    roles = plan_roles(cfg)
    judge = None
    if roles.judge:
        jr = cfg.reward_model.rollout
        judge_engine = cast(Engine, jr.name or engine)  # validated: vllm | hf
        judge = JudgePlan(engine=judge_engine, tensor_parallel_size=_tp(judge_engine, jr.tensor_model_parallel_size))
    pools = {TRAINER_POOL: Pool(t.nnodes, t.n_gpus_per_node)}
    groups = {ACTOR_GROUP: TRAINER_POOL}
    if roles.critic:
        groups[CRITIC_GROUP] = TRAINER_POOL
    if roles.reward_model:
        own = reward_model_pool(cfg)
        if own is not None:
            pools[REWARD_MODEL_POOL] = Pool(*own)
        groups[REWARD_MODEL_GROUP] = REWARD_MODEL_POOL if own is not None else TRAINER_POOL
    async_plan = None
    if disaggregated:
        pools[ROLLOUT_POOL] = Pool(cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node, cfg.rollout.engines_per_gpu)
        groups[ROLLOUT_GROUP] = ROLLOUT_POOL
        a = cfg.async_training
        bypass = uses_rollout_log_probs(cfg) or cfg.algorithm.rollout_correction.bypass_mode
        async_plan = AsyncPlan(staleness=a.staleness_batches, sync_every=a.trigger_parameter_sync_step,
                               partial_rollout=a.partial_rollout, segment=a.partial_rollout_segment,
                               bucket_bytes=a.bucket_mb * 2**20,
                               rollout_log_probs_as_old=bypass,
                               default_is_correction=(a.staleness_batches > 0 and not bypass
                                                      and cfg.algorithm.rollout_correction.rollout_is is None))
    placement = Placement(device=cast(Literal["cuda", "cpu"], t.device), pools=pools, groups=groups)
    return JobPlan(rollout=rollout, roles=roles, judge=judge, placement=placement, async_=async_plan)
