"""The rollout worker of a disaggregated job (actor_rollout_ref.hybrid_engine=False): one generation engine (vLLM or
HF) per rank of the `rollout` pool, fed new weights from the trainer pool over the transfer group
(rlx.workers.weight_transfer); and `RolloutGroup`, the driver's handle on its ranks.

Each rank knows the policy version its weights come from (the training step of the last sync) and tags every token
it generates with it (`rollout_token_versions`). With partial rollout the rank keeps its share of a batch between
calls and generates it in segments (`begin`, `advance`, `collect`): a weight sync between two segments changes the
weights mid-response, and the tags say which tokens came from which version.
"""
from __future__ import annotations

import dataclasses

import ray
import torch

from rlx.config.schema import RLXConfig
from rlx.plan import JobPlan
from rlx.protocol import Batch
from rlx.workers.base_worker import Worker
from rlx.workers.group import ResourcePool, WorkerGroup
from rlx.workers.profiling import profiled

VERSIONS = "rollout_token_versions"
"""[rows, response length] int64: the policy version (training step of the weights) that produced each token."""


class RolloutWorker(Worker):
    NAME = "rollout"

    def profiler_roles(self) -> dict:
        return {"rollout": self.cfg.actor_rollout_ref.rollout.profiler}

    def process_group_timeout_s(self) -> float:
        return self.cfg.actor_rollout_ref.nccl_timeout

    def init_model(self) -> None:
        """The engine, awake for good (its GPU is its own: no sleeping between rollouts), returning its log-probs
        (the trainer corrects for the lag with them)."""
        from rlx.workers.rollout import build_rank_engine

        r = self.cfg.actor_rollout_ref.rollout
        own = dataclasses.replace(r, calculate_log_probs=True, free_cache_engine=False)
        self.rollout, self.tokenizer = build_rank_engine(self.cfg, self.plan.rollout.engine, self.device, self.rank,
                                                         self.world_size, rollout_cfg=own)
        from rlx.workers.rollout import build_agent_rollout

        # multi-turn (the agent loop) runs here too; its trajectories come back whole, each tagged with this version
        self.agent = build_agent_rollout(self.cfg, self.plan, self.rollout, self.tokenizer)
        self.version = -1  # no weights from the trainer yet
        self.transfer = None
        self.partial: _Partial | None = None

    def open_weight_transfer(self, host: str, port: int, world_size: int) -> None:
        from rlx.workers.weight_transfer import WeightTransfer

        self.transfer = WeightTransfer(host, port, 1 + self.rank, world_size, self.device,
                                       self.cfg.actor_rollout_ref.nccl_timeout)

    def receive_weights(self, info, version: int) -> dict:
        """Load the trainer's weights as they arrive; from now on tokens carry `version`."""
        m: dict = {}
        with self.measured("sync", m, "rollout/receive_weights"):
            self.rollout.sync_weights(self.transfer.receive(info))
        self.version = int(version)
        return m

    @profiled("rollout_generate", role="rollout")
    def generate_sequences(self, prompts: Batch) -> Batch:
        """Whole responses (the engine's batch call), every token tagged with this rank's version."""
        from rlx.workers.rollout import rank_seed

        m: dict = {}
        prompts.meta = dict(prompts.meta, seed=rank_seed(self.plan.rollout.engine, int(prompts.meta.get("seed", 0)),
                                                         self.rank))
        with self.measured("generate", m, "rollout/generate"):
            out = (self.agent if self.agent is not None else self.rollout).generate_sequences(prompts)
        m.update(out.meta.pop("agent_metrics", {}))
        out.tensors[VERSIONS] = torch.full_like(out["responses"], self.version)
        m["perf/rollout/generated_tokens_per_s"] = float(out["response_mask"].sum()) / max(
            m["timing_s/rollout/generate"], 1e-9)
        out.meta = dict(out.meta, metrics=m)
        return out

    # ---- partial rollout: a share of the batch generated in segments -------------------------------------------
    def begin(self, prompts: Batch) -> Batch:
        """Take this rank's share of a batch (each prompt repeated n times); nothing is generated yet."""
        self.partial = _Partial(prompts, self.cfg.data.max_response_length)
        return Batch({"rows": torch.zeros(len(self.partial.ids), dtype=torch.long)})

    def advance(self, segment: int) -> int:
        """Generate at most `segment` more tokens of each unfinished response with the current weights; returns how
        many responses are still unfinished."""
        from rlx.workers.rollout import generate_rows

        p = self.partial
        todo = [i for i, done in enumerate(p.done) if not done]
        if todo:
            budgets = [min(segment, p.max_len - len(p.tokens[i])) for i in todo]
            meta = dict(p.meta, seed=int(p.meta.get("seed", 0)) * 1000 + 7919 * p.segments + self.rank)
            outs = generate_rows(self.plan.rollout.engine, self.rollout, [p.ids[i] + p.tokens[i] for i in todo],
                                 budgets, meta, todo)
            for i, budget, (ids, lps) in zip(todo, budgets, outs):
                p.add(i, ids[:budget], lps, self.version, budget, self._eos)
            p.segments += 1
        return sum(1 for done in p.done if not done)

    def collect(self) -> Batch:
        """The finished share, as `generate_sequences` returns it (with the tokens' versions)."""
        out, self.partial = self.partial.batch(self.tokenizer.pad_token_id, self._eos, self.rollout), None
        return out

    @property
    def _eos(self) -> list[int]:
        eos = self.rollout.eos_token_id
        return list(eos) if isinstance(eos, (list, tuple)) else [eos]


class _Partial:
    """One rank's share of a batch being generated in segments: each response's tokens, log-probs and versions."""

    def __init__(self, prompts: Batch, max_len: int):
        n = int(prompts.meta.get("n", 1))
        self.meta, self.max_len, self.segments = dict(prompts.meta), max_len, 0
        self.prompt_ids = prompts["input_ids"].repeat_interleave(n, 0)
        self.prompt_mask = prompts["attention_mask"].repeat_interleave(n, 0)
        self.ids = [row[m.bool()].tolist() for row, m in zip(self.prompt_ids, self.prompt_mask)]
        self.tokens: list[list[int]] = [[] for _ in self.ids]
        self.lps: list[list[float]] = [[] for _ in self.ids]
        self.versions: list[list[int]] = [[] for _ in self.ids]
        self.done = [False] * len(self.ids)
        self.meta["n"] = 1  # each row is one sample from here on

    def add(self, i: int, ids: list[int], lps, version: int, budget: int, eos: list[int]) -> None:
        self.tokens[i] += ids
        self.lps[i] += list(lps[:len(ids)]) if lps is not None else [0.0] * len(ids)
        self.versions[i] += [version] * len(ids)
        ended = len(ids) < budget or (ids and ids[-1] in eos) or len(self.tokens[i]) >= self.max_len
        self.done[i] = bool(ended)

    def batch(self, pad_token_id: int, eos: list[int], rollout) -> Batch:
        from rlx.workers.rollout.base import assemble_output

        rows, R = len(self.ids), self.max_len
        responses = torch.full((rows, R), pad_token_id, dtype=torch.long)
        lps = torch.zeros((rows, R), dtype=torch.float32)
        versions = torch.zeros((rows, R), dtype=torch.long)
        for i in range(rows):
            k = len(self.tokens[i])
            if k:
                responses[i, :k] = torch.tensor(self.tokens[i], dtype=torch.long)
                lps[i, :k] = torch.tensor(self.lps[i], dtype=torch.float32)
                versions[i, :k] = torch.tensor(self.versions[i], dtype=torch.long)
        out = assemble_output(self.prompt_ids, self.prompt_mask, responses, eos, pad_token_id, lps,
                              ignore_eos=bool(getattr(rollout, "ignore_eos", False)))
        first = versions[:, :1].expand_as(versions)
        out.tensors[VERSIONS] = torch.where(out["response_mask"].bool(), versions, first)
        return out


class RolloutGroup(WorkerGroup):
    """The rollout pool's ranks, as the driver calls them."""

    def __init__(self, pool: ResourcePool, cfg: RLXConfig, plan: JobPlan):
        super().__init__(RolloutWorker, pool, cfg, plan)
        self.tp = plan.rollout.tensor_parallel_size

    def init_model(self) -> None:
        self.run_all(RolloutWorker.init_model)

    def open_weight_transfer(self, host: str, port: int, world_size: int):
        """Start joining the trainer -> rollout group (non-blocking)."""
        return [w.open_weight_transfer.remote(host, port, world_size) for w in self.workers]

    def receive_weights(self, info, version: int):
        """Start receiving the weights of `version` (non-blocking; the trainer sends at the same time)."""
        return [w.receive_weights.remote(info, version) for w in self.workers]

    def generate(self, prompts: Batch) -> Batch:
        """Whole responses to `prompts`, split over the rollout's data-parallel groups."""
        return self.run_dp(RolloutWorker.generate_sequences, prompts, replicas=self.tp)

    def generate_in_segments(self, prompts: Batch, segment: int, between) -> Batch:
        """Responses to `prompts` generated `segment` tokens at a time; `between()` runs after each segment (where
        the driver lets a weight sync in). The result is `generate`'s."""
        size = len(prompts)
        self.run_dp(RolloutWorker.begin, prompts, replicas=self.tp)
        while True:
            with between():
                left = ray.get([w.advance.remote(segment) for w in self.workers])
            if not any(left):
                break
        outs = ray.get([w.collect.remote() for w in self.workers])[::self.tp]
        n = int(prompts.meta.get("n", 1))
        return Batch.concat(outs).slice(0, size * n)
