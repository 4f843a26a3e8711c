"""The reward-model worker: scores generated responses with a learned reward model (FSDP, no optimizer), or with a
generative judge (`reward_model.judge.enable`: rlx.workers.judge), their inputs shaped by rlx.reward; and
`RewardModelGroup`, the driver's typed handle on its ranks."""
from __future__ import annotations

from rlx.config.schema import RLXConfig
from rlx.plan import JobPlan
from rlx.protocol import Batch
from rlx.reward.judge import judge_metrics
from rlx.workers.base_worker import Worker
from rlx.workers.group import ResourcePool, WorkerGroup


def max_conversation_tokens(cfg: RLXConfig) -> int | None:
    """The longest conversation the reward model reads (a longer one keeps its end): reward_model.max_length, else
    the serving length verl would give its reward-model server (rollout.max_model_len, or prompt_length +
    response_length), else no limit."""
    rm = cfg.reward_model
    r = rm.rollout
    if rm.max_length:
        return rm.max_length
    if r.max_model_len:
        return r.max_model_len
    return r.prompt_length + r.response_length if r.prompt_length and r.response_length else None


class RewardModelWorker(Worker):
    NAME = "reward_model"

    def profiler_roles(self) -> dict:
        return {}  # verl 0.9.1's reward model has no profiler keys (it is served outside the trainer's workers)

    def init_model(self) -> None:
        """Build the reward model: a classifier, or the judge (on the plan's judge engine)."""
        from transformers import AutoTokenizer

        from rlx.engine.reward_model import RewardModelEngine
        from rlx.models import resolve_model_path
        from rlx.reward.rm_inputs import same_tokenizer

        rm, arr = self.cfg.reward_model, self.cfg.actor_rollout_ref
        actor_path = resolve_model_path(rm.model.input_tokenizer or self.cfg.data.tokenizer or arr.model.path)
        self.actor_tokenizer = AutoTokenizer.from_pretrained(actor_path, trust_remote_code=arr.model.trust_remote_code)
        if arr.model.custom_chat_template:
            self.actor_tokenizer.chat_template = arr.model.custom_chat_template
        assert self.device is not None  # init_distributed ran
        self.judge = None
        if self.plan.judge is not None:
            from rlx.workers.judge import Judge

            self.judge = Judge(self.cfg, self.actor_tokenizer, rank=self.rank, world_size=self.world_size,
                               device=self.device, engine=self.plan.judge.engine)
            return
        self.rm = RewardModelEngine(rm_cfg=rm, strategy=rm.strategy, device=self.device, world_size=self.world_size)
        assert rm.model.path is not None  # validation refuses a reward model without reward_model.model.path
        self.rm_tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(rm.model.path),
                                                          trust_remote_code=rm.model.trust_remote_code)
        self.retemplate = rm.model.input_tokenizer is not None or \
            not same_tokenizer(self.actor_tokenizer, self.rm_tokenizer)

    def compute_rm_score(self, batch: Batch) -> Batch:
        """`rm_scores` `[rows, R]`: the reward model's score on each response's last valid token."""
        from rlx.reward.rm_inputs import actor_sequences, place_scores, retemplated

        rm = self.cfg.reward_model
        m: dict = {}
        if self.judge is not None:
            with self.measured("reward_model", m):
                out = self.judge.score(batch)
            out.tensors["rm_scores"] = place_scores(out["judge_score"], batch["response_mask"])
            out.meta["metrics"] = m
            return out
        with self.measured("reward_model", m):
            inputs = retemplated(batch, self.actor_tokenizer, self.rm_tokenizer, max_conversation_tokens(self.cfg)) \
                if self.retemplate else actor_sequences(batch)
            micro = rm.micro_batch_size_per_gpu  # (the deprecated global key is turned into it at load)
            by_tokens = rm.use_dynamic_bsz or micro is None  # verl 0.9.1's commands give no micro-batch size
            scores = self.rm.compute_rm_score(inputs, micro, rm.forward_max_token_len_per_gpu if by_tokens else None)
        out = Batch({"rm_scores": place_scores(scores["rm_score"], batch["response_mask"])})
        out.meta = {"metrics": m}
        return out


class RewardModelGroup(WorkerGroup):
    """The reward-model ranks, as the driver calls them (each call runs on every rank)."""

    def __init__(self, pool: ResourcePool, cfg: RLXConfig, plan: JobPlan):
        super().__init__(RewardModelWorker, pool, cfg, plan)
        self.judge = plan.judge

    def init_model(self) -> None:
        self.run_all(RewardModelWorker.init_model)

    def compute_rm_score(self, batch: Batch) -> Batch:
        """`rm_scores` of every response (token-level, on its last valid token); a judge's verdicts too
        (`judge_verdict`), with its counts in the call's metrics (reward/judge_*)."""
        # a judge's tensor-parallel group scores one share together
        replicas = self.judge.tensor_parallel_size if self.judge is not None else 1
        out = self.run_dp(RewardModelWorker.compute_rm_score, batch, replicas=replicas)
        if self.judge is not None:
            out.meta.setdefault("metrics", {}).update(judge_metrics(out))
        return out
