"""Async servers over the colocated engines of the actor worker: trajectories `await server.generate(request)`
concurrently; the server batches whatever is pending.

* `HFServer`: pending requests are generated together (micro-batches of the HF rollout's size, in arrival order,
  left-padded to at least `data.max_prompt_length` as the sync path is) in a worker thread, so tools keep running
  while the model generates. A batch runs to its longest request: a request that arrives meanwhile waits for the
  next batch.
* `VLLMServer`: continuous batching on the rollout's own in-process engine (`LLMEngine.add_request` / `step`, the
  loop `LLM.generate` runs), driven from the event loop: a request is added between two engine steps as soon as its
  trajectory sends it, and returned the step it finishes. vLLM's `AsyncLLM` is not used: it always runs its engine
  core in a separate process, which cannot join the worker's `external_launcher` group nor take its weight sync.
"""
from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Optional

import torch

from rlx.workers.rollout.agent.loop import Request, TokenOutput


class _QueuedServer:
    """Requests queue up; one serving task (`_serve`, the engine's own) drains the queue while any are pending."""

    def __init__(self):
        self.pending: deque = deque()
        self.task: Optional[asyncio.Task] = None
        self.requests = 0

    async def generate(self, request: Request) -> TokenOutput:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((request, fut))
        self.requests += 1
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._serve())
        return await fut

    async def _serve(self) -> None:
        raise NotImplementedError


class HFServer(_QueuedServer):
    def __init__(self, rollout, meta: dict, pad_to: int, calc_log_probs: bool):
        super().__init__()
        self.rollout, self.meta, self.pad_to, self.calc = rollout, meta, pad_to, calc_log_probs
        self.gen = torch.Generator(device=rollout.device).manual_seed(int(meta.get("seed", 0)))


    async def _serve(self) -> None:
        await asyncio.sleep(0)  # every trajectory that is ready sends its request first
        while self.pending:
            n = min(len(self.pending), self.rollout.micro_batch_size)
            batch = [self.pending.popleft() for _ in range(n)]
            try:
                rows = await asyncio.to_thread(self.rollout.generate_ids, [r.prompt_ids for r, _ in batch],
                                               [r.max_tokens for r, _ in batch], self.meta, self.gen, self.pad_to)
            except BaseException as e:  # the trajectories waiting on this batch see the engine's error
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                raise
            for (_, fut), (ids, lps) in zip(batch, rows):
                if not fut.done():
                    fut.set_result(TokenOutput(ids, lps if self.calc else None))


class VLLMServer(_QueuedServer):
    def __init__(self, rollout, meta: dict, calc_log_probs: bool):
        super().__init__()
        self.rollout, self.meta, self.calc = rollout, meta, calc_log_probs
        self.engine = rollout.llm.llm_engine
        self.waiting: dict[str, asyncio.Future] = {}
        self.ids = itertools.count()


    async def _serve(self) -> None:
        from vllm.inputs import TokensPrompt

        try:
            await asyncio.sleep(0)
            while self.pending or self.waiting:
                while self.pending:
                    request, fut = self.pending.popleft()
                    rid = f"agent-{next(self.ids)}"
                    params = self.rollout.request_params(self.meta, request.max_tokens, request.sample_index)
                    self.engine.add_request(rid, TokensPrompt(prompt_token_ids=list(request.prompt_ids)), params)
                    self.waiting[rid] = fut
                for out in self.engine.step():
                    if out.finished and out.request_id in self.waiting:
                        self.waiting.pop(out.request_id).set_result(self._output(out))
                await asyncio.sleep(0)  # trajectories whose request finished go on (tools, next turn)
        except BaseException as e:
            for fut in list(self.waiting.values()) + [f for _, f in self.pending]:
                if not fut.done():
                    fut.set_exception(e)
            self.waiting.clear()
            self.pending.clear()
            raise

    def _output(self, out) -> TokenOutput:
        sample = out.outputs[0]
        ids = list(sample.token_ids)
        from rlx.workers.rollout.vllm_compat import sampled_logprobs

        return TokenOutput(ids, sampled_logprobs(sample, ids) if self.calc else None)
