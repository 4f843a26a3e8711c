"""Configuration of the agent-loop rollout (`rollout.mode=async`, `rollout.agent.*`) and of multi-turn tool calling
(`rollout.multi_turn.*`), verl's keys with verl's defaults; see docs/agent.md. Plain dataclasses, here so that the
typed config depends on nothing above it, and their rules."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlx.config.rules import check_positive, choice

AGENT_LOOPS = ("single_turn_agent", "tool_agent")  # the built-in ones (rlx.workers.rollout.agent)
TOOL_FORMATS = ("hermes", "gpt-oss")
TRUNCATE_SIDES = ("left", "middle", "right")
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")


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
    tool_response_truncate_side: str = choice("middle", TRUNCATE_SIDES)
    """Where a long tool response is cut: left (keep the end) | right (keep the start) | middle (keep both ends)."""
    use_inference_chat_template: bool = False
    """False: the trajectory holds the token ids the model generated, turn by turn (verl's default; True, re-rendering
    earlier turns with the inference template, is not supported)."""
    tokenization_sanity_check_mode: str = choice("strict", SANITY_CHECK_MODES)
    """Compare each finished tool trajectory with the chat template applied to its whole conversation: strict (warn
    on any difference) | ignore_strippable (ignore whitespace-only differences) | disable."""
    format: str = choice("hermes", TOOL_FORMATS)
    """Tool-call format parsed from the model's text: hermes (`<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>`, Qwen's) | gpt-oss (OpenAI's harmony messages: a call is addressed `to=functions.NAME` and ends
    with `<|call|>`; the tools' replies are laid out as harmony messages rather than by the chat template)."""
    interaction_config_path: Optional[str] = None
    """verl's interaction YAML: `interaction: [{name, class_name: pkg.mod.Class, config: {...}}]`. In the tool_agent
    loop, a model turn without a tool call goes to the row's interaction (extra_info.interaction_kwargs.name), whose
    reply is the next user turn, until it says to stop (rlx.workers.rollout.agent.interactions; docs/agent.md)."""
    num_repeat_rollouts: Optional[int] = None
    """With an interaction (verl's CollabLLM loop): the trajectory trained is the model's first turn, and this many
    conversations are simulated from it (interaction and model taking turns); the reward function finds them in
    extra_info["messages"] and their interaction scores in extra_info["turn_scores"]. null: off."""
    tool_timeout_s: float = 60.0
    """A tool call taking longer than this many seconds is stopped (a sync function tool's worker process is killed);
    the model reads an error message instead."""


def uses_agent_loop(rollout) -> bool:
    """Whether the rollout (`actor_rollout_ref.rollout`) runs the agent loop: mode=async, or multi_turn.enable."""
    return rollout.mode == "async" or bool(rollout.multi_turn.enable)


def check_agent(cfg, errors):
    """rollout.mode, rollout.agent.* and rollout.multi_turn.* (docs/agent.md)."""
    r, key = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    if r.name == "sglang":
        errors.append(f"{key}.name=sglang: rlx serves vLLM (and HF generate), not SGLang; verl's multi-turn configs "
                      f"run on vLLM here with the same keys. Fix: {key}.name=vllm.")
    agent, mt = r.agent, r.multi_turn
    if not agent.agent_loop_config_path and agent.default_agent_loop not in AGENT_LOOPS:
        errors.append(f"{key}.agent.default_agent_loop={agent.default_agent_loop!r} is not a built-in agent loop "
                      f"{list(AGENT_LOOPS)}. Fix: register it with {key}.agent.agent_loop_config_path, or pick one "
                      f"of those.")
    # the agent loop's and tools' files exist: rlx.trainer.probes
    check_positive(errors, f"{key}.multi_turn.max_parallel_calls", mt.max_parallel_calls)
    check_positive(errors, f"{key}.multi_turn.max_tool_response_length", mt.max_tool_response_length)
    if not (isinstance(mt.tool_timeout_s, (int, float)) and mt.tool_timeout_s > 0):
        errors.append(f"{key}.multi_turn.tool_timeout_s={mt.tool_timeout_s!r} must be a positive number of seconds. "
                      f"Fix: {key}.multi_turn.tool_timeout_s=30.")
    for k in ("max_assistant_turns", "max_user_turns"):
        v = getattr(mt, k)
        if v is not None and (not isinstance(v, int) or v < 1):
            errors.append(f"{key}.multi_turn.{k}={v!r} must be a positive integer or null (no limit). Fix: "
                          f"{key}.multi_turn.{k}=null.")
    n = mt.num_repeat_rollouts
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        errors.append(f"{key}.multi_turn.num_repeat_rollouts={n!r} must be a positive integer or null. Fix: "
                      f"{key}.multi_turn.num_repeat_rollouts=null.")
    elif n is not None and not mt.interaction_config_path:
        errors.append(f"{key}.multi_turn.num_repeat_rollouts={n} simulates conversations with an interaction agent, "
                      f"and none is set. Fix: set {key}.multi_turn.interaction_config_path, or "
                      f"{key}.multi_turn.num_repeat_rollouts=null.")
    tools_wanted = mt.enable or agent.default_agent_loop == "tool_agent"
    if uses_agent_loop(r) and tools_wanted and not cfg.data.return_raw_chat:
        errors.append("the tool_agent loop renders each row's chat itself and needs data.return_raw_chat=True "
                      "(got False). Fix: data.return_raw_chat=True.")
