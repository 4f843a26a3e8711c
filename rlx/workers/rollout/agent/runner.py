"""`AgentRollout`: the rollout of `rollout.mode=async` (and of `multi_turn.enable`). It takes the place of the
engine's `generate_sequences` in the actor worker (the weight sync, wake-up and sleep around it are unchanged) and
returns the same tensors (see rlx.workers.rollout.base), with two differences for multi-turn rows: `response_mask`
is 0 on the tools' tokens, and `attention_mask` is 1 on every token of the trajectory, theirs included.

Every row of the batch (prompt i, sample j: row i * n + j) runs the agent loop its `agent_name` names (else
`agent.default_agent_loop`) as one task of a single event loop; all tasks start at once, so their requests reach the
engine server together and each trajectory goes on as soon as its own request is answered.

`meta["agent_metrics"]` of the result: per-trajectory means of turns, tool calls, tool errors, tokens of the model
and of the tools, seconds spent waiting on tools; the share of tool trajectories whose turn-by-turn tokens differ
from their conversation rendered at once (multi_turn.tokenization_sanity_check_mode).
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import os
from typing import Callable

import numpy as np
import torch

from rlx.protocol import Batch
from rlx.workers.rollout.agent import single_turn, tool_agent  # noqa: F401  (registers the built-in loops)
from rlx.workers.rollout.agent.loop import AGENT_LOOPS, AgentLoop, AgentOutput, LoopContext
from rlx.workers.rollout.agent.interactions import load_interactions
from rlx.workers.rollout.agent.tools import load_tools

logger = logging.getLogger("rlx")


def load_agent_loop_config(path: str) -> dict:
    """{name: (class, kwargs)} of verl's agent-loop YAML (`rollout.agent.agent_loop_config_path`)."""
    import yaml

    key = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
    if not os.path.isfile(path):
        raise ValueError(f"{key}={path!r} is not a file")
    with open(path) as f:
        entries = yaml.safe_load(f) or []
    out = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry or "_target_" not in entry:
            raise ValueError(f"{key}={path!r}: entry {i} needs name and _target_ (package.module.Class)")
        module, _, cls_name = str(entry["_target_"]).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError, ValueError) as e:
            raise ValueError(f"{key}={path!r}: {entry['_target_']} cannot be imported ({e})") from e
        if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
            raise ValueError(f"{key}={path!r}: {entry['_target_']} is not a subclass of {AgentLoop.__module__}."
                             f"AgentLoop")
        out[str(entry["name"])] = (cls, {k: v for k, v in entry.items() if k not in ("name", "_target_")})
    return out


class AgentRollout:
    def __init__(self, rollout, engine: str, tokenizer, rollout_cfg, max_prompt_length: int,
                 max_response_length: int, pad_token_id: int):
        self.rollout, self.engine, self.pad_token_id = rollout, engine, pad_token_id
        self.P, self.R = int(max_prompt_length), int(max_response_length)
        agent, mt = rollout_cfg.agent, rollout_cfg.multi_turn
        self.calc = bool(rollout_cfg.calculate_log_probs)
        self.loops: dict[str, tuple[Callable[..., AgentLoop], dict]]
        self.loops = {name: (cls, {}) for name, cls in AGENT_LOOPS.items()}
        if agent.agent_loop_config_path:
            self.loops.update(load_agent_loop_config(agent.agent_loop_config_path))
        self.default = agent.default_agent_loop
        if self.default not in self.loops:
            raise ValueError(f"actor_rollout_ref.rollout.agent.default_agent_loop={self.default!r} is not an agent "
                             f"loop; choose one of {sorted(self.loops)} (or register it in agent_loop_config_path)")
        self.ctx = LoopContext(tokenizer, self.P, self.R, mt, load_tools(mt.tool_config_path, mt.function_tool_path),
                               load_interactions(mt.interaction_config_path))
        self._instances: dict[str, AgentLoop] = {}

    def loop(self, name: str) -> AgentLoop:
        if name not in self._instances:
            if name not in self.loops:
                raise ValueError(f"a row's agent_name={name!r} is not an agent loop; registered: {sorted(self.loops)}"
                                 f" (add it with actor_rollout_ref.rollout.agent.agent_loop_config_path)")
            cls, kwargs = self.loops[name]
            self._instances[name] = cls(self.ctx, **kwargs)
        return self._instances[name]

    def server(self, meta: dict):
        from rlx.workers.rollout import agent_server

        return agent_server(self.engine, self.rollout, meta, pad_to=self.P, calc_log_probs=self.calc)

    def generate_sequences(self, prompts: Batch) -> Batch:
        meta = dict(prompts.meta)
        n = int(meta.get("n", 1))
        ids, mask = prompts["input_ids"].cpu(), prompts["attention_mask"].cpu()
        nt = prompts.non_tensors
        jobs = []
        for i in range(ids.shape[0]):
            name = nt["agent_name"][i] if "agent_name" in nt and nt["agent_name"][i] else self.default
            raw_chat = nt["raw_chat"][i] if "raw_chat" in nt else None
            extra = nt["extra_info"][i] if "extra_info" in nt and isinstance(nt["extra_info"][i], dict) else {}
            prompt_ids = ids[i][mask[i].bool()].tolist()
            for j in range(n):
                jobs.append((self.loop(str(name)), dict(prompt_ids=prompt_ids, raw_chat=raw_chat, extra_info=extra,
                                                        sample_index=i * n + j)))
        outputs = asyncio.run(self._run(self.server(meta), jobs))
        out = self.assemble(outputs)
        if any(o.extra for o in outputs):  # verl's extra fields: the reward function reads them in extra_info
            extra = np.empty(len(outputs), dtype=object)
            extra[:] = [o.extra for o in outputs]
            out.non_tensors["agent_extra"] = extra
        out.meta["agent_metrics"] = agent_metrics(outputs)
        return out

    @staticmethod
    async def _run(server, jobs) -> list[AgentOutput]:
        return list(await asyncio.gather(*(loop.run(server, **kwargs) for loop, kwargs in jobs)))

    def assemble(self, outputs: list[AgentOutput]) -> Batch:
        N, P, R = len(outputs), self.P, self.R
        prompts = torch.full((N, P), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros((N, P), dtype=torch.long)
        responses = torch.full((N, R), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((N, R), dtype=torch.long)
        seq_mask = torch.zeros((N, R), dtype=torch.long)
        log_probs = torch.zeros((N, R), dtype=torch.float32)
        for k, o in enumerate(outputs):
            assert len(o.prompt_ids) <= P and len(o.response_ids) <= R and len(o.response_mask) == len(o.response_ids)
            if o.prompt_ids:
                prompts[k, P - len(o.prompt_ids):] = torch.tensor(o.prompt_ids)
                prompt_mask[k, P - len(o.prompt_ids):] = 1
            L = len(o.response_ids)
            if L:
                responses[k, :L] = torch.tensor(o.response_ids)
                response_mask[k, :L] = torch.tensor(o.response_mask)
                seq_mask[k, :L] = 1
                if o.response_log_probs is not None:
                    log_probs[k, :L] = torch.tensor(o.response_log_probs, dtype=torch.float32)
        attention_mask = torch.cat([prompt_mask, seq_mask], dim=1)
        tensors = {"prompts": prompts, "responses": responses, "response_mask": response_mask,
                   "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
                   "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0)}
        if self.calc:
            tensors["rollout_log_probs"] = log_probs * response_mask
        return Batch(tensors)


def agent_metrics(outputs: list[AgentOutput]) -> dict[str, float]:
    """Per-trajectory means (and the max of turns and of the tool wait) under agent/."""
    if not outputs:
        return {}
    n = len(outputs)
    turns = [o.num_turns for o in outputs]
    out = {"agent/num_turns/mean": sum(turns) / n, "agent/num_turns/max": float(max(turns)),
           "agent/num_turns/min": float(min(turns))}
    for key in ("tool_calls", "tool_errors", "tool_wait_s", "assistant_tokens", "tool_tokens",
                "tokenization_mismatch"):
        values = [float(o.metrics.get(key, 0.0)) for o in outputs]
        out[f"agent/{key}/mean"] = sum(values) / n
    out["agent/tool_wait_s/max"] = max(float(o.metrics.get("tool_wait_s", 0.0)) for o in outputs)
    for key in ("interaction_turns", "interaction_score", "interaction_tokens"):
        if any(key in o.metrics for o in outputs):
            out[f"agent/{key}/mean"] = sum(float(o.metrics.get(key, 0.0)) for o in outputs) / n
    return out
