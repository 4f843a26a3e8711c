"""The rollout worker of a disaggregated job (actor_rollout_ref.hybrid_engine=False): one generation engine (vLLM or
HF) per rank of the `rollout` pool, fed new weights from the trainer pool over the transfer group
(rlx.workers.weight_transfer); and `RolloutGroup`, the driver's handle on its ranks.

Each rank knows the policy version its weights come from (the training step of the last sync) and tags every token
it generates with it (`rollout_token_versions`). With partial rollout the rank keeps its share of each open batch
between calls and generates them in segments, all open batches together (`begin`, `advance`, `collect`; the
driver's `SegmentPump`): on vLLM its responses stay live requests in the engine (`VLLMStream`), on hf each segment is
one generate call. A weight sync between two segments changes the weights mid-response, and the tags say which
tokens came from which version.
"""
from __future__ import annotations

import dataclasses
import threading

import ray
import torch

from rlx.config.schema import RLXConfig
from rlx.plan import JobPlan
from rlx.protocol import Batch
from rlx.workers.base_worker import Worker
from rlx.workers.group import ResourcePool, WorkerGroup
from rlx.workers.profiling import profiled
from rlx.workers.weight_transfer import WeightTransfer, transfer_slots

VERSIONS = "rollout_token_versions"
"""[rows, response length] int64: the policy version (training step of the weights) that produced each token."""


class RolloutWorker(Worker):
    NAME = "rollout"
    stream = None  # partial rollout's live requests on vLLM (set by init_model)

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
        tp = self.plan.rollout.tensor_parallel_size
        # without tensor parallelism each rank is a process group of its own (RolloutGroup), its engine a lone world
        rank, world = (0, 1) if tp == 1 else (self.rank, self.world_size)
        assert self.device is not None  # init_distributed ran
        self.rollout, self.tokenizer = build_rank_engine(self.cfg, self.plan.rollout.engine, self.device, rank, world,
                                                         rollout_cfg=own, dp_rank=self.rank // tp)
        from rlx.workers.rollout import build_agent_rollout, build_stream

        # multi-turn (the agent loop) runs here too; its trajectories come back whole, each tagged with this version
        self.agent = build_agent_rollout(self.cfg, self.plan, self.rollout, self.tokenizer)
        self.version = -1  # no weights from the trainer yet
        self.transfer: WeightTransfer | None = None
        self.partials: dict[int, _Partial] = {}  # batches being generated in segments (partial rollout), by key
        # vLLM: the open batches' responses, live in the engine between calls (VLLMStream); None on hf
        self.stream = None if self.agent is not None else build_stream(self.plan.rollout.engine, self.rollout)

    def open_weight_transfer(self, host: str, port: int, rank: int, world_size: int) -> None:
        """Join this rank's trainer -> rollout group (its engine slot's), as `rank` of `world_size`."""
        from rlx.workers.weight_transfer import WeightTransfer

        assert self.device is not None  # init_distributed ran
        self.transfer = WeightTransfer(host, [(port, world_size)], rank, self.device,
                                       self.cfg.actor_rollout_ref.nccl_timeout)

    def receive_weights(self, info, version: int) -> dict:
        """Load the trainer's weights as they arrive; from now on tokens carry `version`."""
        m: dict = {}
        with self.measured("sync", m, "rollout/receive_weights"):
            if self.stream is not None:
                self.stream.pause()  # in-flight responses go on with the new weights at the next advance
            assert self.transfer is not None  # open_weight_transfer ran
            self.rollout.sync_weights(self.transfer.receive(info))
        self.version = int(version)
        if self.stream is not None:
            m.update(self.stream.take_metrics())  # the engine's work with the weights just replaced
        return m

    @profiled("rollout_generate", role="rollout")
    def generate_sequences(self, prompts: Batch) -> Batch:
        """Whole responses (the engine's batch call), every token tagged with this rank's version."""
        from rlx.workers.rollout import rank_seed

        m: dict = {}
        prompts.meta = dict(prompts.meta, seed=rank_seed(self.plan.rollout.engine, int(prompts.meta.get("seed", 0)),
                                                         self.rank))
        if self.stream is not None:
            self.stream.pause()  # open partial batches wait (they go on at the next advance)
        with self.measured("generate", m, "rollout/generate"):
            out = (self.agent if self.agent is not None else self.rollout).generate_sequences(prompts)
        m.update(out.meta.pop("agent_metrics", {}))
        out.tensors[VERSIONS] = torch.full_like(out["responses"], self.version)
        m["perf/rollout/generated_tokens_per_s"] = float(out["response_mask"].sum()) / max(
            m["timing_s/rollout/generate"], 1e-9)
        out.meta = dict(out.meta, metrics=m)
        return out

    # ---- partial rollout: shares of batches generated in segments ----------------------------------------------
    def begin(self, prompts: Batch, key: int = 0) -> Batch:
        """Take this rank's share of batch `key` (each prompt repeated n times); nothing is generated yet. Several
        batches may be open at once: each `advance` moves all of them."""
        self.partials[key] = _Partial(prompts, self.cfg.data.max_response_length, key)
        if self.stream is not None:
            self.stream.add(self.partials[key], list(range(len(self.partials[key].ids))))
        return Batch({"rows": torch.zeros(len(self.partials[key].ids), dtype=torch.long)})

    def advance(self, segment: int) -> dict[int, int]:
        """Generate at most `segment` more tokens of each unfinished response of every open batch with the current
        weights, in one engine call (the engine batches them together, so a batch's long tail shares the GPU with
        the next batch's start); returns how many responses of each batch are still unfinished. On vLLM the
        responses stay live in the engine between calls (continuous batching, `VLLMStream`): this runs its loop
        for `segment` steps."""
        from rlx.workers.rollout import generate_row_groups

        if self.stream is not None:
            self.stream.advance(segment, self.version)
        else:
            groups, parts = [], []
            for p in self.partials.values():
                todo = [i for i, done in enumerate(p.done) if not done]
                if todo:
                    budgets = [min(segment, p.max_len - len(p.tokens[i])) for i in todo]
                    groups.append(([p.ids[i] + p.tokens[i] for i in todo], budgets,
                                   p.reseeded(p.segments, self.rank), todo))
                    parts.append(p)
            outs = generate_row_groups(self.plan.rollout.engine, self.rollout, groups)
            for p, (_, budgets, _, todo), got in zip(parts, groups, outs):
                for i, budget, (ids, lps) in zip(todo, budgets, got):
                    p.add(i, ids[:budget], lps, self.version, budget, self._eos)
                p.segments += 1
        return {key: sum(1 for done in p.done if not done) for key, p in self.partials.items()}

    def collect(self, key: int = 0) -> Batch:
        """Batch `key`'s finished share, as `generate_sequences` returns it (with the tokens' versions)."""
        p = self.partials.pop(key)
        return p.batch(self.tokenizer.pad_token_id, self._eos, self.rollout)

    @property
    def _eos(self) -> list[int]:
        eos = self.rollout.eos_token_id
        return list(eos) if isinstance(eos, (list, tuple)) else [eos]


class _Partial:
    """One rank's share of a batch being generated in segments: each response's tokens, log-probs and versions."""

    def __init__(self, prompts: Batch, max_len: int, key: int = 0):
        n = int(prompts.meta.get("n", 1))
        self.meta, self.max_len, self.segments, self.key = dict(prompts.meta), max_len, 0, key
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

    def reseeded(self, k: int, offset: int = 0) -> dict:
        """The batch's sampling settings with the seed of its k-th continuation (a segment, a resume after a sync),
        so a continued response does not replay the random draws of its start."""
        return dict(self.meta, seed=int(self.meta.get("seed", 0)) * 1000 + 7919 * k + offset)

    def extend(self, i: int, ids: list[int], lps, version: int) -> None:
        """Response i's next tokens (and log-probs), made by weights `version` (its end is marked by the caller)."""
        self.tokens[i] += ids
        self.lps[i] += list(lps) if lps is not None else [0.0] * len(ids)
        self.versions[i] += [version] * len(ids)

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
        # ranks without tensor parallelism never talk to each other: each is a process group of its own, so several
        # may share a GPU (rollout.engines_per_gpu; NCCL takes no two ranks of one GPU in a group)
        super().__init__(RolloutWorker, pool, cfg, plan, lone=plan.rollout.tensor_parallel_size == 1)
        self.tp = plan.rollout.tensor_parallel_size
        self.slots = transfer_slots(self.world_size, pool.ranks_per_bundle)
        """The ranks of each trainer -> rollout group (one group per engine slot of a GPU)."""

    def init_model(self) -> None:
        """The engines, one slot at a time: engines sharing a GPU start one after the other (vLLM sizes its KV cache
        from what its profiling sees of the GPU's memory, which another engine starting meanwhile would change)."""
        for ranks in self.slots:
            ray.get([self.workers[r].init_model.remote() for r in ranks])

    def open_weight_transfer(self, host: str, ports: list[int]):
        """Start joining the trainer -> rollout groups, one per slot, at `ports` (non-blocking)."""
        return [self.workers[r].open_weight_transfer.remote(host, port, 1 + i, 1 + len(ranks))
                for port, ranks in zip(ports, self.slots) for i, r in enumerate(ranks)]

    @property
    def transfer_groups(self) -> list[int]:
        """Each trainer -> rollout group's world size (the trainer's rank 0 and the slot's ranks)."""
        return [1 + len(ranks) for ranks in self.slots]

    def receive_weights(self, info, version: int):
        """Start receiving the weights of `version` (non-blocking; the trainer sends at the same time)."""
        return [w.receive_weights.remote(info, version) for w in self.workers]

    def generate(self, prompts: Batch) -> Batch:
        """Whole responses to `prompts`, split over the rollout's data-parallel groups."""
        return self.run_dp(RolloutWorker.generate_sequences, prompts, replicas=self.tp)

    def segment_pump(self, segment: int, between) -> "SegmentPump":
        """Partial rollout's driver side: batches generated `segment` tokens at a time, together (see SegmentPump)."""
        return SegmentPump(self, segment, between)


class SegmentPump:
    """Generates batches on the rollout workers in segments, for any number of driver threads at once.

    `generate(prompts)` opens the batch on the workers (`begin`) and returns its responses once they are all finished.
    Meanwhile one of the waiting threads at a time calls `advance` on every worker, which moves every open batch by
    one segment in one engine call: the next batch starts while the last one's longest responses still run, so the
    engine stays busy through a batch's long tail. `between()` wraps each segment (the driver's gate: a weight sync
    lands between two segments, and the tokens after it carry the new version)."""

    def __init__(self, group: RolloutGroup, segment: int, between):
        self.group, self.segment, self.between = group, segment, between
        self.cv = threading.Condition()
        self.left: dict[int, int | None] = {}  # unfinished responses of each open batch (None: not counted yet)
        self.pumping, self.next_key = False, 0
        self.error: BaseException | None = None

    def generate(self, prompts: Batch) -> Batch:
        g = self.group
        with self.cv:
            key, self.next_key = self.next_key, self.next_key + 1
        g.run_dp(RolloutWorker.begin, prompts, replicas=g.tp, key=key)
        with self.cv:
            self.left[key] = None
        while True:
            with self.cv:
                self.cv.wait_for(lambda: not self.pumping or self.left[key] == 0 or self.error is not None)
                if self.error is not None:
                    raise RuntimeError("partial rollout: a segment failed") from self.error
                if self.left[key] == 0:
                    del self.left[key]
                    break
                self.pumping = True
            try:
                with self.between():
                    lefts = ray.get([w.advance.remote(self.segment) for w in g.workers])
            except BaseException as e:
                with self.cv:
                    self.error = e
                raise
            finally:
                with self.cv:
                    self.pumping = False
                    if self.error is None:
                        for k in self.left:  # a batch opened while this segment ran is counted by the next one
                            if all(k in counts for counts in lefts):
                                self.left[k] = sum(counts[k] for counts in lefts)
                    self.cv.notify_all()
        outs = ray.get([w.collect.remote(key) for w in g.workers])[::g.tp]
        return Batch.concat(outs).slice(0, len(prompts) * int(prompts.meta.get("n", 1)))
