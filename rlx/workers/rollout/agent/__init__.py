"""The agent-loop rollout (verl's `rollout.mode=async`): every trajectory is a coroutine that sends token requests
to an async engine server and, for the `tool_agent`, runs tools between turns.

Rooms, one concern each (no Ray anywhere here; tools never see the engine):
    loop.py        `AgentLoop` (the base), `Request`/`TokenOutput`/`AgentOutput`, the registry of loops by name
    single_turn.py `single_turn_agent`: one generation, the sync rollout's distribution
    tool_agent.py  `tool_agent`: generate -> parse tool calls -> run tools -> append their turn -> generate ...
    hermes.py      the hermes tool-call parser (`<tool_call>{json}</tool_call>`), robust to malformed calls
    tools.py       `BaseTool`, `function_tool`, loading verl's tool YAML, calling a tool with a timeout
    gsm8k_tool.py  verl's GSM8K answer-check tool
    servers.py     async servers over the colocated engines (HF generate, vLLM's in-process engine)
    runner.py      `AgentRollout`: runs a batch of trajectories concurrently and assembles the rollout tensors
"""
from rlx.workers.rollout.agent.loop import AGENT_LOOPS, AgentLoop, AgentOutput, Request, TokenOutput, register

__all__ = ["AGENT_LOOPS", "AgentLoop", "AgentOutput", "Request", "TokenOutput", "register"]
