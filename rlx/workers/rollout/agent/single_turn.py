"""`single_turn_agent`: one generation from the row's prompt tokens, as the sync rollout does, but as its own
request (so a long response does not hold the others)."""
from __future__ import annotations

from typing import Optional

from rlx.workers.rollout.agent.loop import AgentLoop, AgentOutput, Request, Server, register


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoop):
    async def run(self, server: Server, *, prompt_ids: list[int], raw_chat: Optional[list[dict]],
                  extra_info: dict, sample_index: int) -> AgentOutput:
        R = self.ctx.max_response_length
        out = await server.generate(Request(list(prompt_ids), R, sample_index))
        ids = list(out.token_ids[:R])
        lps = list(out.log_probs[:R]) if out.log_probs is not None else None
        return AgentOutput(list(prompt_ids), ids, [1] * len(ids), lps, num_turns=2,
                           metrics={"assistant_tokens": len(ids), "tool_tokens": 0, "tool_calls": 0,
                                    "tool_errors": 0, "tool_wait_s": 0.0})
