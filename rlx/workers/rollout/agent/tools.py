"""Tools: verl's two contracts, its YAML, and one guarded way to call a tool.

* `BaseTool` (verl's stateful contract): `create(instance_id, **kwargs)` per call, `execute(instance_id, parameters)`
  -> (ToolResponse | str, reward, metrics), `release(instance_id)`. Listed in `multi_turn.tool_config_path`:
      tools:
        - class_name: rlx.workers.rollout.agent.gsm8k_tool.Gsm8kTool   (verl's class paths of its own tools map
          config: {type: native}                                         to rlx's, see VERL_TOOL_CLASSES)
          tool_schema: {type: function, function: {name: ..., description: ..., parameters: {...}}}
* `function_tool`: a plain (sync or async) function in the file `multi_turn.function_tool_path`; its OpenAI schema
  comes from the signature and the docstring's `Args:` lines. It returns a str, a ToolResponse, a dict (sent as
  JSON) or (text, reward).

`call_tool` runs one call: a tool that raises, hangs past the timeout, ends its process or returns nonsense yields an
error text for the model and `error=True`, never an exception. Synchronous function tools run in worker processes
(`tool_procs`): a call past the timeout is killed, not abandoned; what it prints is captured, capped and logged; a
tool that ends its process (`os._exit`) is named in a warning and its trajectory reads an error reply. Async tools
run on the rollout's event loop (a timed-out one is cancelled).
"""
from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

from rlx import verl_names
from rlx.workers.rollout.agent import tool_procs

logger = logging.getLogger("rlx")
VERL_TOOL_CLASSES = {"verl.tools.gsm8k_tool.Gsm8kTool": "rlx.workers.rollout.agent.gsm8k_tool.Gsm8kTool"}


@dataclass
class ToolResponse:
    text: Optional[str] = None


class BaseTool:
    def __init__(self, config: dict, tool_schema: dict):
        self.config = dict(config or {})
        self.tool_schema: Any = tool_schema  # a dict; verl's tools (verl_tool.py) keep the pydantic model
        self.name = tool_schema["function"]["name"]

    @classmethod
    def build(cls, config: dict, tool_schema: dict) -> "BaseTool":
        """The tool of one entry of the tool YAML (its `config` and `tool_schema` dicts)."""
        return cls(config, tool_schema)

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or uuid.uuid4().hex, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[Any, float, dict]:
        raise NotImplementedError

    async def release(self, instance_id: str, **kwargs) -> None:
        pass


class FunctionTool:
    """A plain function as a tool (stateless: no create/release). A sync function runs in a worker process of
    `tool_procs` (found there by `ref`: its module, or the file `path` it was loaded from); an async one runs here."""

    def __init__(self, fn: Callable, schema: dict, path: Optional[str] = None):
        self.fn, self.tool_schema, self.name = fn, schema, schema["function"]["name"]
        self.is_async = inspect.iscoroutinefunction(fn)
        self.ref = None if self.is_async else tool_procs.function_ref(fn, path)

    async def call(self, parameters: dict, timeout_s: float):
        """The function's return value; raises `tool_procs.ToolTimeout` / `ToolProcessDied` / `ToolError` for a
        sync function that timed out (killed), ended its process or raised."""
        if self.is_async:
            return await self.fn(**parameters)
        # the pool's own threads, not the event loop's default executor: asyncio.run waits for that one at the end
        # of the rollout; each of these returns by the call's deadline
        pool = tool_procs.pool()
        deadline = time.monotonic() + timeout_s
        assert self.ref is not None  # a sync function's
        value, output = await asyncio.get_running_loop().run_in_executor(
            pool.callers, pool.call, self.ref, dict(parameters), deadline)
        if output:
            logger.info("tool %r printed:\n%s", self.name, output)
        return value


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def function_tool(fn: Callable) -> Callable:
    """Mark `fn` as a tool of a `function_tool_path` file; its schema is built from the signature and docstring."""
    setattr(fn, "__rlx_tool__", True)  # an attribute of the function object, which mypy cannot type
    return fn


def function_schema(fn: Callable) -> dict:
    doc = inspect.getdoc(fn) or ""
    arg_docs = dict(re.findall(r"^\s+(\w+)\s*(?:\([^)]*\))?:\s*(.+)$", doc.split("Args:", 1)[1], re.M)) \
        if "Args:" in doc else {}
    props, required = {}, []
    for name, p in inspect.signature(fn).parameters.items():
        ann = p.annotation if p.annotation is not inspect.Parameter.empty else str
        if isinstance(ann, str):
            ann = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}.get(ann, str)
        props[name] = {"type": _JSON_TYPES.get(ann, "string"), "description": arg_docs.get(name, "")}
        if p.default is inspect.Parameter.empty:
            required.append(name)
    description = doc.split("Args:", 1)[0].strip()
    return {"type": "function", "function": {"name": fn.__name__, "description": description,
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


def schema_of(tool) -> dict:
    """A tool's OpenAI function schema as a dict (a verl tool keeps it as a pydantic model), for the chat template."""
    schema = tool.tool_schema
    return schema.model_dump(exclude_unset=True, exclude_none=True) if hasattr(schema, "model_dump") else schema


def _import(path: str):
    path = VERL_TOOL_CLASSES.get(path, path)
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"tool class_name {path!r} must be a dotted path package.module.Class")
    return verl_names.import_user_object(path, f"tool class_name {path!r}", "put its module on PYTHONPATH "
                                         "(rollout.multi_turn.tool_config_path)")


def load_tool_config(path: str) -> list[BaseTool]:
    """The tools of verl's tool YAML (`rollout.multi_turn.tool_config_path`)."""
    import yaml

    if not os.path.isfile(path):
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path!r} is not a file")
    with open(path) as f:
        spec = yaml.safe_load(f) or {}
    tools = []
    for i, entry in enumerate(spec.get("tools") or []):
        where = f"{path}: tools[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry or "tool_schema" not in entry:
            raise ValueError(f"{where} needs class_name and tool_schema (verl's tool YAML)")
        schema = entry["tool_schema"]
        if not (isinstance(schema, dict) and isinstance(schema.get("function"), dict)
                and schema["function"].get("name")):
            raise ValueError(f"{where}: tool_schema must be {{type: function, function: {{name: ..., ...}}}}")
        cls = _import(entry["class_name"])
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
            raise ValueError(f"{where}: {entry['class_name']} is not a subclass of {BaseTool.__module__}.BaseTool")
        try:
            tools.append(cls.build(entry.get("config") or {}, schema))
        except ValueError as e:  # e.g. a verl tool's schema that verl's model does not read
            raise ValueError(f"{where}: {e}") from e
    return tools


def load_function_tools(path: str) -> list[FunctionTool]:
    """The `@function_tool` functions of the Python file `rollout.multi_turn.function_tool_path`."""
    if not os.path.isfile(path):
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.function_tool_path={path!r} is not a file")
    spec = importlib.util.spec_from_file_location(f"rlx_function_tools_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.function_tool_path={path!r} is not a Python file. "
                         f"Fix: a .py file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fns = [v for v in vars(module).values() if callable(v) and getattr(v, "__rlx_tool__", False)]
    if not fns:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.function_tool_path={path!r} defines no function "
                         f"decorated with @function_tool")
    return [FunctionTool(fn, function_schema(fn), path) for fn in fns]


def load_tools(tool_config_path: Optional[str], function_tool_path: Optional[str]) -> dict:
    """{name: tool} of both sources; a name given twice is an error."""
    tools: dict = {}
    found = (load_tool_config(tool_config_path) if tool_config_path else []) + \
        (load_function_tools(function_tool_path) if function_tool_path else [])
    for tool in found:
        if tool.name in tools:
            raise ValueError(f"tool name {tool.name!r} is defined twice (multi_turn.tool_config_path / "
                             f"function_tool_path)")
        tools[tool.name] = tool
    return tools


_KILL_SLACK_S = 5.0


@dataclass
class ToolResult:
    text: str
    reward: float = 0.0
    error: bool = False
    wait_s: float = 0.0


def _text_of(raw) -> tuple[str, float]:
    reward = 0.0
    if isinstance(raw, tuple):
        raw, reward = raw[0], float(raw[1]) if len(raw) > 1 and raw[1] is not None else 0.0
    if isinstance(raw, ToolResponse):
        raw = raw.text or ""
    if isinstance(raw, (dict, list)):
        raw = json.dumps(raw, ensure_ascii=False)
    if not isinstance(raw, str):
        raw = str(raw)
    return raw, reward


async def call_tool(tool, arguments: dict, tools_kwargs: dict, timeout_s: float) -> ToolResult:
    """Run one call of `tool`; every failure becomes an error text (see the module docstring)."""
    t0 = time.perf_counter()

    async def run():
        if isinstance(tool, FunctionTool):
            return _text_of(await tool.call(arguments, timeout_s))
        create_kwargs = (tools_kwargs.get(tool.name) or {}).get("create_kwargs") or {}
        instance_id, _ = await tool.create(create_kwargs=create_kwargs, **create_kwargs)
        try:
            raw, reward, _metrics = await tool.execute(instance_id, arguments)
            text, _ = _text_of(raw)
            return text, float(reward or 0.0)
        finally:
            await tool.release(instance_id)

    # a sync function tool keeps its own deadline (and kills the call at it); the slack lets it report first
    in_process = isinstance(tool, FunctionTool) and not tool.is_async
    try:
        text, reward = await asyncio.wait_for(run(), timeout=timeout_s + (_KILL_SLACK_S if in_process else 0.0))
        return ToolResult(text, reward, False, time.perf_counter() - t0)
    except (asyncio.TimeoutError, tool_procs.ToolTimeout) as e:
        if isinstance(e, tool_procs.ToolTimeout):
            logger.warning("rlx: tool %r timed out after %g s: %s", tool.name, timeout_s, e)
        return ToolResult(f"Error: tool '{tool.name}' timed out after {timeout_s:g} s", 0.0, True,
                          time.perf_counter() - t0)
    except tool_procs.ToolProcessDied as e:
        logger.warning("rlx: tool %r ended its worker process (%s); the trajectory got an error reply and the "
                       "process was replaced", tool.name, e)
        return ToolResult(f"Error: tool '{tool.name}' crashed: its process ended ({e})", 0.0, True,
                          time.perf_counter() - t0)
    except tool_procs.ToolError as e:
        if e.output:
            logger.info("tool %r raised; its output:\n%s", tool.name, e.output)
        return ToolResult(f"Error: tool '{tool.name}' failed: {e}", 0.0, True, time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - a tool's failure is the model's observation, never a crashed step
        return ToolResult(f"Error: tool '{tool.name}' failed: {type(e).__name__}: {e}", 0.0, True,
                          time.perf_counter() - t0)


def truncate(text: str, limit: int, side: str) -> str:
    """verl's cut of a long tool response (`max_tool_response_length` characters, `tool_response_truncate_side`)."""
    if len(text) <= limit:
        return text
    if side == "left":
        return "(truncated)..." + text[-limit:]
    if side == "right":
        return text[:limit] + "...(truncated)"
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half:]
