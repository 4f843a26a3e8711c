"""verl's import names for the users' files that rlx loads, served by rlx's own code when verl is not installed.

A custom reward file (`custom_reward_function.path`), a dataset class (`data.custom_cls`), a tool class (the
tool YAML's `class_name`) or an interaction class (the interaction YAML's `class_name`) written for verl imports
verl's modules. Before rlx runs such a file, its loader calls
`install()`: a finder at the end of `sys.meta_path` then answers the `verl.*` imports of `SERVED` with modules built
from rlx's implementations of the same meaning and signature (rlx's rules equal verl's functions value for value).

- Only the names of `SERVED` exist; importing any other `verl` module fails with one line that names it and what
  rlx serves instead (`refusal`); a name missing from a served module fails as Python's own ImportError, which the
  loaders turn into the same line.
- A real verl is never shadowed: with verl importable (or already imported), `install()` does nothing, and the
  finder answers `verl` only while no real verl is found. A folder named `verl` without `__init__.py` on the path
  (a verl clone's root, next to where the job starts) is no verl: Python would import it as an empty namespace
  package, so the finder goes first on `sys.meta_path`, ahead of that.
- The targets are named by string and imported when a file asks for them, so this module imports nothing of rlx
  and every layer's loader may use it.
"""
from __future__ import annotations

import asyncio
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Optional

# verl module -> {name: "rlx.module:attribute"}
SERVED: dict[str, dict[str, str]] = {
    "verl.utils.reward_score": {"default_compute_score": "rlx.reward.functions:default_compute_score"},
    "verl.utils.reward_score.gsm8k": {"compute_score": "rlx.reward.rules.gsm8k:compute_score",
                                      "extract_solution": "rlx.reward.rules.gsm8k:extract_solution"},
    "verl.utils.reward_score.math_reward": {"compute_score": "rlx.reward.rules.math_boxed:compute_score",
                                            "last_boxed_only_string": "rlx.reward.rules.math_boxed:last_boxed",
                                            "remove_boxed": "rlx.reward.rules.math_boxed:unbox"},
    "verl.utils.reward_score.math_dapo": {"compute_score": "rlx.reward.rules.math_minerva:compute_score",
                                          "last_boxed_only_string": "rlx.reward.rules.math_minerva:last_boxed",
                                          "remove_boxed": "rlx.reward.rules.math_minerva:unbox",
                                          "normalize_final_answer": "rlx.reward.rules.math_minerva:normalise"},
    "verl.utils.ray_utils": {"get_event_loop": "rlx.verl_names:get_event_loop"},
    "verl.utils.rollout_trace": {"rollout_trace_op": "rlx.verl_names:rollout_trace_op"},
    "verl.utils.dataset": {"RLHFDataset": "rlx.data.verl_dataset:RLHFDataset"},
    "verl.utils.dataset.rl_dataset": {"RLHFDataset": "rlx.data.verl_dataset:RLHFDataset"},
    "verl.tools.base_tool": {"BaseTool": "rlx.workers.rollout.agent.verl_tool:BaseTool",
                             "OpenAIFunctionToolSchema": "rlx.workers.rollout.agent.verl_tool:OpenAIFunctionToolSchema",
                             "ToolResponse": "rlx.workers.rollout.agent.tools:ToolResponse"},
    "verl.tools.schemas": {
        **{n: f"rlx.workers.rollout.agent.verl_tool:{n}" for n in (
            "OpenAIFunctionToolSchema", "OpenAIFunctionSchema", "OpenAIFunctionParametersSchema",
            "OpenAIFunctionPropertySchema")},
        "ToolResponse": "rlx.workers.rollout.agent.tools:ToolResponse"},
    "verl.interactions.base": {"BaseInteraction": "rlx.workers.rollout.agent.interactions:BaseInteraction"},
    "verl.interactions.gsm8k_interaction": {
        "Gsm8kInteraction": "rlx.workers.rollout.agent.interactions:Gsm8kInteraction"},
}
# the packages above them (empty but for their served names and submodules)
PACKAGES = {".".join(m.split(".")[:i]) for m in SERVED for i in range(1, m.count(".") + 1)}
_MARK = "__rlx_serves_verl__"
_served: list[str] = []  # the modules built so far in this process, in order
_reported: set[str] = set()


def get_event_loop() -> asyncio.AbstractEventLoop:
    """verl's `ray_utils.get_event_loop`: this thread's event loop, a new one (set as current) when it has none."""
    try:
        return asyncio.get_event_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        return loop


def rollout_trace_op(func):
    """verl's rollout-tracing decorator with tracing off (rlx does not trace rollouts): the function itself."""
    return func


def _real_verl() -> bool:
    """Whether a verl other than this module's is imported or importable (a namespace package, a folder named verl
    without `__init__.py`, is not one)."""
    module = sys.modules.get("verl")
    if module is not None:
        return not getattr(module, _MARK, False) and getattr(module, "__file__", None) is not None
    for finder in sys.meta_path:
        if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec("verl", None)
        if spec is not None and spec.origin not in (None, "namespace"):
            return True
    return False


def install() -> bool:
    """Serve verl's names to the files loaded from now on in this process, unless a real verl is there (then those
    files import it). Returns whether rlx serves them."""
    module = sys.modules.get("verl")
    if module is not None and not getattr(module, _MARK, False) and getattr(module, "__file__", None) is None:
        del sys.modules["verl"]  # an empty namespace package imported before: served from now on
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return not _real_verl()
    if _real_verl():
        return False
    sys.meta_path.insert(0, _Finder())
    return True


def _offers(module: str) -> str:
    """What rlx serves nearest to `module`: the names of the served modules that share its longest prefix."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        near = [m for m in SERVED if m == prefix or m.startswith(prefix + ".")]
        if near and prefix != "verl":
            break
    else:
        near = list(SERVED)
    return "; ".join(f"{m}: {', '.join(SERVED[m])}" for m in near)


def refusal(module: str, name: Optional[str] = None) -> str:
    """The line for an import of verl's `module` (or of `name` from it) that rlx does not serve."""
    what = f"{name!r} of {module}" if name else module
    return (f"{what} is not one of the verl names rlx serves when verl is not installed; rlx serves "
            f"{_offers(module)}. Fix: import those (or rlx's own code), or install verl.")


def refusal_of(e: BaseException) -> Optional[str]:
    """The refusal line of an ImportError raised by a user's file importing verl, or None for any other error."""
    if not isinstance(e, ImportError):
        return None
    if isinstance(e, NotServed):
        return str(e)
    module = str(e.name or "")
    if module != "verl" and not module.startswith("verl."):
        return None
    if not isinstance(e, ModuleNotFoundError) and module in SERVED | dict.fromkeys(PACKAGES):
        missing = str(e).split("'")[1] if str(e).startswith("cannot import name '") else None
        return refusal(module, missing)
    return refusal(module)


def import_user_object(dotted: str, what: str, fix: str):
    """`package.module.name` from a user's file, with verl's names served (`install`). A failed import is a
    ValueError: `<what> cannot be imported: <the refusal line>` for a verl name rlx does not serve, else
    `<what> cannot be imported (<error>). Fix: <fix>`."""
    module, _, name = dotted.rpartition(".")
    install()
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        line = refusal_of(e)
        raise ValueError(f"{what} cannot be imported: {line}" if line else
                         f"{what} cannot be imported ({e}). Fix: {fix}") from e


def served_line() -> Optional[str]:
    """Once per process: the verl names rlx served to the users' files so far (None when none, or said already)."""
    new = [m for m in _served if m in SERVED and m not in _reported]
    if not new:
        return None
    _reported.update(new)
    listed = "; ".join(f"{m}.{{{', '.join(SERVED[m])}}}" for m in new)
    return f"rlx: verl is not installed here; your files' verl imports got rlx's own implementations: {listed}"


class NotServed(ModuleNotFoundError):
    """A `verl.*` module that rlx does not serve."""


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname != "verl" and not fullname.startswith("verl."):
            return None
        if fullname == "verl" and _real_verl():
            return None  # installed since: the real one
        if fullname != "verl" and not getattr(sys.modules.get("verl"), _MARK, False):
            return None  # a real verl's submodule
        if fullname in SERVED or fullname in PACKAGES:
            return importlib.util.spec_from_loader(fullname, self, is_package=fullname in PACKAGES)
        raise NotServed(refusal(fullname), name="verl")  # not its own name: `from pkg import x` does not mute it

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        setattr(module, _MARK, True)
        for name, target in SERVED.get(module.__name__, {}).items():
            where, _, attr = target.partition(":")
            setattr(module, name, getattr(importlib.import_module(where), attr))
        _served.append(module.__name__)
