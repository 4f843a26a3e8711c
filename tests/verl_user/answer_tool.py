"""A verl tool: the model submits an answer and reads back its GSM8K score (verl's gsm8k tool's shape)."""
from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.reward_score import gsm8k
from verl.utils.rollout_trace import rollout_trace_op


class AnswerCheckTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._instances = {}
        self.penalty = float(config.get("penalty", 0.05))

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        if instance_id is None:
            instance_id = str(uuid4())
        if ground_truth is None:
            ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        self._instances[instance_id] = {"ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        answer = str(parameters.get("answer", ""))
        state = self._instances[instance_id]
        reward = gsm8k.compute_score("#### " + answer.removeprefix("#### "), state["ground_truth"], method="flexible")
        step_reward = 0.0 if reward > state["reward"] else -self.penalty
        state["reward"] = reward
        return ToolResponse(text=f"{self.tool_schema.function.name}: {answer} scores {reward}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return self._instances[instance_id]["reward"]

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instances[instance_id]
