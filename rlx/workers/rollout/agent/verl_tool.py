"""verl's tool contract as rlx serves it (`rlx.verl_names`): `verl.tools.base_tool.BaseTool` and the OpenAI
function schema models of `verl.tools.schemas`, for tool classes written for verl.

A verl tool gets its schema as an `OpenAIFunctionToolSchema` (pydantic; `tool_schema.function.name`,
`model_dump()`), where rlx's own tools get a dict; otherwise it is rlx's `BaseTool` (create / execute / release,
called by rlx's tool agent). Its `ToolResponse` is rlx's: text only (rlx has no multi-modal tool replies).
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from rlx.workers.rollout.agent import tools


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter of a function: its JSON type, description, allowed values (other JSON-schema keys kept)."""
    model_config = ConfigDict(extra="allow")
    type: str
    description: Optional[str] = None
    enum: Optional[list[str]] = None


class OpenAIFunctionParametersSchema(BaseModel):
    """A function's parameters: a JSON-schema object."""
    model_config = ConfigDict(extra="allow")
    type: str
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str]


class OpenAIFunctionSchema(BaseModel):
    """A function: name, description, parameters."""
    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(
        default_factory=lambda: OpenAIFunctionParametersSchema(type="object", properties={}, required=[]))
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool in OpenAI's format: ``{type: function, function: {...}}``."""
    type: str
    function: OpenAIFunctionSchema


class BaseTool(tools.BaseTool):
    """verl's BaseTool: the tool YAML's `tool_schema` arrives as an `OpenAIFunctionToolSchema`."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema]):
        self.config = config
        schema = tool_schema or self.get_openai_tool_schema()
        if schema is None:
            raise ValueError(f"{type(self).__name__} has no tool schema. Fix: give tool_schema in the tool YAML, or "
                             f"return one from get_openai_tool_schema().")
        self.tool_schema = schema
        self.name = schema.function.name

    @classmethod
    def build(cls, config: dict, tool_schema: dict) -> "BaseTool":
        from pydantic import ValidationError

        try:
            schema = OpenAIFunctionToolSchema.model_validate(tool_schema)
        except ValidationError as e:
            first = e.errors()[0]
            raise ValueError(f"{cls.__name__}: tool_schema is not an OpenAI function schema as verl reads it: "
                             f"{'.'.join(map(str, first['loc']))}: {first['msg']} ({e.error_count()} error(s)). "
                             f"Fix: give function.name, function.description and function.parameters "
                             f"{{type: object, properties: {{...}}, required: [...]}}.") from None
        return cls(config, schema)

    def get_openai_tool_schema(self) -> Optional[OpenAIFunctionToolSchema]:
        return getattr(self, "tool_schema", None)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[Any, float, dict]:
        return tools.ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0
