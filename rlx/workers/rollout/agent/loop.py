"""What every agent loop shares: the request it sends to the engine server, what comes back, what a finished
trajectory is, and the registry of loops by name (verl's `agent_name` values)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol


@dataclass
class Request:
    """One generation: the full context so far as token ids, and how many tokens may follow."""
    prompt_ids: list[int]
    max_tokens: int
    sample_index: int = 0
    """Row of this trajectory in the batch (i * n + j): the sampling seed of the row follows from it."""


@dataclass
class TokenOutput:
    token_ids: list[int]
    log_probs: Optional[list[float]] = None


class Server(Protocol):
    async def generate(self, request: Request) -> TokenOutput: ...


@dataclass
class AgentOutput:
    """A finished trajectory: `prompt_ids` then `response_ids` (every token after the prompt: the model's and the
    tools'); `response_mask` is 1 on the model's tokens and 0 on the tools' (their loss and advantages are masked)."""
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_log_probs: Optional[list[float]] = None
    num_turns: int = 2
    """user/tool turns + assistant turns + 1 (verl's count: a single turn is 2)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per trajectory: tool_calls, tool_errors, tool_wait_s, assistant_tokens, tool_tokens (with an interaction:
    interaction_turns, interaction_score, interaction_tokens)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """verl's extra fields of the trajectory, which the reward function finds in its row's extra_info: with an
    interaction `turn_scores` (its score of each turn), with num_repeat_rollouts `messages` (the simulated
    conversations) and `turn_scores` (one list per conversation)."""


class AgentLoop:
    """A trajectory's policy around the engine: `run` gets the row's prompt (token ids and, when the data has it,
    the raw chat messages), its `extra_info` and the engine `server`, and returns an `AgentOutput`.

    Subclasses are registered under a name (`@register("name")`, or `rollout.agent.agent_loop_config_path`);
    keyword arguments of the config entry reach `__init__` after the `context`."""

    def __init__(self, context: "LoopContext", **kwargs: Any):
        self.ctx = context
        if kwargs:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(kwargs)}")

    async def run(self, server: Server, *, prompt_ids: list[int], raw_chat: Optional[list[dict]],
                  extra_info: dict, sample_index: int) -> AgentOutput:
        raise NotImplementedError


@dataclass
class LoopContext:
    """What a loop may use besides the server: the tokenizer, the response budget, the rollout config's
    multi_turn section, the tools and the interactions by name."""
    tokenizer: Any
    max_prompt_length: int
    max_response_length: int
    multi_turn: Any  # rlx.config.agent.MultiTurnConfig
    tools: dict = field(default_factory=dict)
    interactions: dict = field(default_factory=dict)
    """Interaction agents by name (multi_turn.interaction_config_path; rlx.workers.rollout.agent.interactions)."""


AGENT_LOOPS: dict[str, Callable[..., AgentLoop]] = {}


def register(name: str):
    """Class decorator: make an `AgentLoop` subclass the loop called `name`."""
    def deco(cls):
        AGENT_LOOPS[name] = cls
        return cls
    return deco
