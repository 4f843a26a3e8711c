"""Test helpers for the agent loop (imported by tests/unit/test_agent_loop.py and, by name, by the Ray workers of its
end-to-end run through `agent_loop_config_path` / `function_tool_path`).

The built-in tiny model has random weights: it never writes a tool call and rarely an EOS. `ForcedToolAgent` is the
tool_agent whose turns are capped at `turn_tokens` and that calls `probe` whenever the model's turn holds no call of
its own, so the multi-turn path (tools, their turn's tokens, masks, metrics) runs for real on CPU.
"""
from __future__ import annotations

import asyncio
import time

from rlx.workers.rollout.agent.hermes import ToolCall
from rlx.workers.rollout.agent.interactions import BaseInteraction
from rlx.workers.rollout.agent.tool_agent import ToolAgentLoop
from rlx.workers.rollout.agent.tools import BaseTool, ToolResponse, function_tool

# A chat template with a tool role for the byte-level tiny tokenizer (EOS "<|eos|>" ends a turn, then a space);
# one line without double quotes, so that it passes as a command-line override.
TEMPLATE = (
    "{% if tools %}tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %} {% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}[tool]{{ m['content'] }}<|eos|> "
    "{% else %}[{{ m['role'] }}]{{ m['content'] }}<|eos|> {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}")


class ForcedToolAgent(ToolAgentLoop):
    """Calls `tool` (probe) with {`arg`: the length of the turn's text} when the model's turn holds no call."""

    def __init__(self, context, turn_tokens: int = 6, tool: str = "probe", arg: str = "n", **kwargs):
        super().__init__(context, **kwargs)
        self.turn_tokens, self.tool, self.arg = int(turn_tokens), tool, arg

    def turn_budget(self, remaining: int) -> int:
        return min(remaining, self.turn_tokens)

    def parse_calls(self, text: str):
        content, calls = super().parse_calls(text)
        return content, calls or [ToolCall(self.tool, {self.arg: len(text)})]


@function_tool
def probe(n: int) -> str:
    """Report a number back.

    Args:
        n: the number
    """
    return f"probe saw {n}"


async def async_probe(n: int) -> str:
    """`probe` as an async function (not a `function_tool` of this file): the in-process tests put it in probe's
    place so that they start no tool worker process."""
    return f"probe saw {n}"


class BoomTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("boom")


class SlowTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(30)
        return ToolResponse(text="late"), 0.0, {}


@function_tool
def slow_sync(seconds: float) -> str:
    """Sleep (a synchronous tool that hangs).

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke"


class CappedAgent(ToolAgentLoop):
    """The tool_agent with its model turns capped at `turn_tokens` (the tiny random model rarely writes an EOS)."""

    def __init__(self, context, turn_tokens: int = 6, **kwargs):
        super().__init__(context, **kwargs)
        self.turn_tokens = int(turn_tokens)

    def turn_budget(self, remaining: int) -> int:
        return min(remaining, self.turn_tokens)


class TryAgain(BaseInteraction):
    """An interaction that tells the model to try again until its `patience`-th answer, then accepts it; it keeps
    what it was shown and which trajectories are open."""

    def __init__(self, config: dict):
        super().__init__(config)
        self.patience = int(config.get("patience", 3))
        self.open: dict[str, list] = {}
        self.seen: list[list[dict]] = []

    async def start_interaction(self, instance_id=None, **kwargs):
        self.open[instance_id] = []
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        self.seen.append([dict(m) for m in messages])
        answers = self.open[instance_id]
        answers.append(messages[-1]["content"])
        if len(answers) >= self.patience:
            return True, "Accepted.", 1.0, {}
        return False, f"Try again ({len(answers)})", 0.0, {}

    async def finalize_interaction(self, instance_id=None, **kwargs):
        del self.open[instance_id]
