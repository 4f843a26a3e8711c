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
