"""Which function scores a response: the built-in rule of its `data_source`, or a custom function from a file.

A reward function has verl's signature ``fn(data_source, solution_str, ground_truth, extra_info=None, **kw)``
and returns a float, or a dict with a ``"score"`` float plus extra keys (logged by the trainer as means).
`load_reward_fn` gives the job's function (custom_reward_function.path, else the built-in rules of rlx.reward.rules,
dispatched on data_source).
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Callable

from rlx import verl_names
from rlx.config.schema import CustomRewardFunctionConfig
from rlx.reward.rules import gsm8k, math_sources
from rlx.reward.rules.synthetic import REWARDS as SYNTHETIC_REWARDS

_GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")  # verl's name, and the short one rlx also takes


def known_data_sources() -> list[str]:
    return sorted([*_GSM8K_SOURCES, *math_sources.SOURCES, *SYNTHETIC_REWARDS])


def is_builtin_source(data_source) -> bool:
    """Whether a built-in reward scores `data_source`."""
    return (data_source in _GSM8K_SOURCES or math_sources.scorer(data_source) is not None
            or data_source in SYNTHETIC_REWARDS)


def builtin_score(data_source, solution_str: str, ground_truth, extra_info=None, **score_kwargs):
    """The built-in rule reward of ``data_source``, called with ``score_kwargs`` (`reward_model.score_kwargs`,
    e.g. ``method="flexible"`` or ``format_score=0.1`` for GSM8K)."""
    if data_source in _GSM8K_SOURCES:
        return gsm8k.compute_score(solution_str, ground_truth, **score_kwargs)
    if (scorer := math_sources.scorer(data_source)) is not None:
        return scorer(solution_str, ground_truth, **score_kwargs)
    if data_source in SYNTHETIC_REWARDS:
        return SYNTHETIC_REWARDS[data_source](solution_str, ground_truth, extra_info=extra_info, **score_kwargs)
    raise ValueError(f"no built-in reward for data_source={data_source!r}; known: {known_data_sources()} (and "
                     f"aime*). Fix: for other data, write a function fn(data_source, solution_str, ground_truth, "
                     f"extra_info=None, **kwargs) in a .py file and set custom_reward_function.path (and "
                     f"custom_reward_function.name if it is not 'compute_score')")


def _import_error(path: str, e: Exception) -> str:
    """Why the reward file failed to import, and the fix; for a verl name rlx does not serve: which ones it does."""
    line = verl_names.refusal_of(e)
    if line:
        return f"custom_reward_function.path={path!r} failed to import: {line}"
    return (f"custom_reward_function.path={path!r} failed to import ({type(e).__name__}: {e}). Fix: make the file "
            f"import on its own (python <the file> shows the error)")


def default_compute_score(data_source, solution_str: str, ground_truth, extra_info=None, sandbox_fusion_url=None,
                          concurrent_semaphore=None, memory_limit_mb=None, **kwargs):
    """verl's default score function, with its signature: dispatch on ``data_source`` to the built-in rule rewards,
    each with its own defaults. As in verl, extra keyword arguments are accepted and not passed on; the sandbox
    arguments serve verl's code data sources, which rlx does not score (such a source is a ValueError)."""
    return builtin_score(data_source, solution_str, ground_truth, extra_info)


def load_reward_fn(custom_cfg: CustomRewardFunctionConfig, score_kwargs: dict | None = None) -> Callable:
    """The custom function ``custom_cfg.name`` from file ``custom_cfg.path`` with ``custom_cfg.reward_kwargs``
    bound (verl's `custom_reward_function.reward_kwargs`) if a path is set (a `FileFunction`); else the built-in
    rewards, with ``score_kwargs`` (`reward_model.score_kwargs`) bound when given, verl's `default_compute_score`
    otherwise. Each of them pickles, so a pool of processes can score with it (rlx.reward.pool)."""
    path = custom_cfg.path
    if not path:
        if score_kwargs:
            return functools.partial(builtin_score, **score_kwargs)
        return default_compute_score
    name = custom_cfg.name
    path = os.path.expanduser(str(path))
    fn = _read_function(path, name)
    _refuse_reward_loop_judge(fn, path, name)
    return FileFunction(path, name, custom_cfg.reward_kwargs, fn)


def _read_function(path: str, name: str) -> Callable:
    """Function `name` of the Python file `path` (its module code runs), or a ValueError naming the key and fix."""
    if not os.path.isfile(path):
        raise ValueError(f"custom_reward_function.path={path!r} is not a file. Fix: give a .py file defining "
                         f"{name}(data_source, solution_str, ground_truth, extra_info=None, **kwargs)")
    module_name = f"rlx_custom_reward_{abs(hash(os.path.abspath(path)))}"
    verl_names.install()  # a file written for verl imports its names: rlx serves them when verl is not installed
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError("not a Python source file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001
        raise ValueError(_import_error(path, e)) from e
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ValueError(f"custom_reward_function.name={name!r} is not a function in "
                         f"custom_reward_function.path={path!r}. Fix: name one of the functions there: {found}")
    return fn


class FileFunction:
    """A score function defined in a Python file (custom_reward_function.path and .name), called with its bound
    keyword arguments (custom_reward_function.reward_kwargs) as functools.partial would. A function of a module
    loaded from a file cannot be pickled by reference, so this one pickles as (path, name, kwargs) and reads the
    file again where it is unpickled (a scoring process of rlx.reward.pool)."""

    def __init__(self, path: str, name: str, kwargs: dict | None = None, fn: Callable | None = None):
        self.path, self.name, self.kwargs = path, name, dict(kwargs or {})
        self.fn = fn if fn is not None else _read_function(path, name)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **{**self.kwargs, **kwargs})

    def __reduce__(self):
        return FileFunction, (self.path, self.name, self.kwargs)

    def __repr__(self) -> str:
        return f"FileFunction({self.name} of {self.path!r}, kwargs={self.kwargs})"


def _refuse_reward_loop_judge(fn: Callable, path: str, name: str) -> None:
    """verl's generative-reward-model functions call the judge through verl's reward-loop HTTP router (a required
    `reward_router_address` argument); rlx has no such server: say so before any step, pointing at rlx's judge."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    wanted = params.get("reward_router_address")
    if wanted is not None and wanted.default is inspect.Parameter.empty:
        raise ValueError(f"custom_reward_function.path={path!r}: {name} takes reward_router_address, verl's "
                         f"reward-loop interface to a judge served over HTTP, which rlx does not have. Fix: use rlx's "
                         f"built-in judge (reward_model.judge.enable=True, reward_model.judge.prompt_template=...; "
                         f"docs/reward_model.md) and drop custom_reward_function.path.")


def describe_fn(fn: Callable) -> str:
    """`name (file)` of a score function, through functools.partial and FileFunction (bound reward_kwargs)."""
    while isinstance(fn, (functools.partial, FileFunction)):
        fn = fn.func if isinstance(fn, functools.partial) else fn.fn
    name = getattr(fn, "__qualname__", None) or repr(fn)
    code = getattr(fn, "__code__", None)
    return f"{name} ({code.co_filename})" if code is not None else name
