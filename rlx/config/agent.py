"""Configuration of the agent-loop rollout (`rollout.mode=async`, `rollout.agent.*`) and of multi-turn tool calling
(`rollout.multi_turn.*`), verl's keys with verl's defaults; see docs/agent.md. Plain dataclasses, here so that the
typed config depends on nothing above it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class CustomAsyncServerConfig:
    path: Optional[str] = None
    """verl key (not supported: rlx serves its own engines in the actor worker)."""
    name: Optional[str] = None
    """verl key (not supported: rlx serves its own engines in the actor worker)."""


@dataclass
class AgentLoopConfig:
    num_workers: int = 8
    """verl's number of agent-loop worker processes; rlx runs every trajectory of a rank as a task of one event
    loop in the actor worker, so this changes nothing (speed only)."""
    default_agent_loop: str = "single_turn_agent"
    """Agent loop of a row without an `agent_name` column: single_turn_agent | tool_agent | a name registered by
    agent_loop_config_path."""
    agent_loop_config_path: Optional[str] = None
    """YAML list of custom agent loops, each `{name: ..., _target_: package.module.Class, <kwargs>}`; the class
    subclasses rlx.workers.rollout.agent.AgentLoop and gets the extra keys as keyword arguments."""
    custom_async_server: CustomAsyncServerConfig = field(default_factory=CustomAsyncServerConfig)
    """verl key (not supported)."""


@dataclass
class MultiTurnConfig:
    enable: bool = False
    """Multi-turn rollout: runs the agent loop as rollout.mode=async does (verl has no sync rollout). The loop of a
    row is its agent_name column (verl's rows for tools say tool_agent), else agent.default_agent_loop."""
    max_assistant_turns: Optional[int] = None
    """Stop a trajectory after this many generations (null: until the response budget is spent or the model
    calls no tool)."""
    tool_config_path: Optional[str] = None
    """verl's tool YAML: `tools: [{class_name: pkg.mod.Class, config: {...}, tool_schema: {type: function,
    function: {name, description, parameters}}}]`; the class subclasses rlx.workers.rollout.agent.tools.BaseTool."""
    function_tool_path: Optional[str] = None
    """Python file whose functions decorated with rlx.workers.rollout.agent.tools.function_tool become tools (the
    schema from the signature and docstring)."""
    max_user_turns: Optional[int] = None
    """Stop a trajectory after this many tool (user-side) turns (null: no limit)."""
    max_parallel_calls: int = 1
    """Tool calls run per assistant turn (the first ones the model made; they run concurrently)."""
    max_tool_response_length: int = 256
    """A tool's text beyond this many characters is cut (tool_response_truncate_side) before it is tokenized."""
    tool_response_truncate_side: str = "middle"
    """Where a long tool response is cut: left (keep the end) | right (keep the start) | middle (keep both ends)."""
    use_inference_chat_template: bool = False
    """False: the trajectory holds the token ids the model generated, turn by turn (verl's default; True, re-rendering
    earlier turns with the inference template, is not supported)."""
    tokenization_sanity_check_mode: str = "strict"
    """Compare each finished tool trajectory with the chat template applied to its whole conversation: strict (warn
    on any difference) | ignore_strippable (ignore whitespace-only differences) | disable."""
    format: str = "hermes"
    """Tool-call format parsed from the model's text: hermes (`<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>`, Qwen's)."""
    num_repeat_rollouts: Optional[int] = None
    """verl key (not supported)."""
    tool_timeout_s: float = 60.0
    """A tool call taking longer than this many seconds is stopped (a sync function tool's worker process is killed);
    the model reads an error message instead."""


def uses_agent_loop(rollout) -> bool:
    """Whether the rollout (`actor_rollout_ref.rollout`) runs the agent loop: mode=async, or multi_turn.enable."""
    return rollout.mode == "async" or bool(rollout.multi_turn.enable)
