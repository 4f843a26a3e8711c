"""The hermes tool-call format (Qwen2.5's and verl's default): the model writes

    <tool_call>
    {"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}
    </tool_call>

anywhere in its turn, possibly several times. `parse` never raises: a block that is not a JSON object with a string
`name` and object `arguments` (a JSON string holding an object is accepted too), or a `<tool_call>` left open, comes
back as a call with an `error`, which the tool agent shows the model instead of running anything.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

START, END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(START) + r"(.*?)" + re.escape(END), re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)
    error: Optional[str] = None
    """Why the block could not be used (then `name` may be empty)."""


def parse(text: str) -> tuple[str, list[ToolCall]]:
    """(the text without its tool-call blocks, the calls in order)."""
    calls = [_one(m.group(1)) for m in _BLOCK.finditer(text)]
    content = _BLOCK.sub("", text)
    if START in content:  # opened, never closed (cut by the length limit, or a typo)
        calls.append(ToolCall(name="", error=f"a {START} block was not closed with {END}"))
        content = content[:content.index(START)]
    return content, calls


def _one(body: str) -> ToolCall:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return ToolCall(name="", error=f"the tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(obj, dict):
        return ToolCall(name="", error="the tool call must be a JSON object with 'name' and 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(name="", error="the tool call has no 'name' string")
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name=name, error=f"the arguments of {name!r} are not valid JSON ({e.msg})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name=name, error=f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}")
    return ToolCall(name=name, arguments=args)
