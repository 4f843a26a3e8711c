"""verl's GSM8K answer-check tool (`calc_gsm8k_reward`): the model submits an answer and reads back whether it is
right. Each call checks "#### <answer>" with the flexible GSM8K method against the row's ground truth
(`extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`); the tool's own reward is 0.0 when the
answer improves on the call's starting score and -0.05 otherwise (a fresh instance per call, as in verl's tool
agent, so: 0.0 for a right answer, -0.05 for a wrong one). The step's reward is still the final answer's."""
from __future__ import annotations

import uuid
from typing import Optional

from rlx.reward.rules.gsm8k import compute_score
from rlx.workers.rollout.agent.tools import BaseTool, ToolResponse


class Gsm8kTool(BaseTool):
    def __init__(self, config: dict, tool_schema: dict):
        super().__init__(config, tool_schema)
        self._state: dict[str, dict] = {}

    async def create(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid.uuid4().hex
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._state[instance_id] = {"ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[ToolResponse, float, dict]:
        answer = parameters.get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        submitted = answer if answer.startswith("#### ") else "#### " + answer
        state = self._state[instance_id]
        reward = compute_score(submitted, state["ground_truth"], method="flexible", format_score=0.0, score=1.0)
        tool_reward = 0.0 if reward > state["reward"] else -0.05
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward}"), tool_reward, {}

    async def release(self, instance_id: str, **kwargs) -> None:
        self._state.pop(instance_id, None)
