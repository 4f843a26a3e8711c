"""The test layout's rule: `tests/unit/` holds the tests that run in the pytest process alone, `tests/e2e/` those that
start Ray or any other process (a training job, FSDP ranks spawned over gloo, a subprocess, vLLM) or need a GPU.
Every test under tests/e2e/ is marked `e2e` at collection; `make test-fast` runs tests/unit/ (`pytest tests/unit -m
"not long"`), less the few marked `long`: unit tests that take seconds each (whole models trained or generated,
sweeps of config loads), listed in `LONG`.

The rule is checked, not trusted: a test under tests/unit/ that reads as starting a process is a collection error
naming it. That is read from the test files themselves (`ast`, nothing is imported): a test starts a process when its
function, a fixture it takes, or a function of its module (or of a helper module of tests/, scripts/ or
benchmarks/, or the unit module an e2e file shares helpers with) that it calls, directly or through others, names one
of `HEAVY_NAMES` (`fit_job`, `ray_local`, `spawn_per_strategy`, `subprocess`, `ray`, `Tracker`, ...) or asks
`pytest.importorskip("vllm")`; or is listed in `E2E`, or marked `slow` or `e2e` by hand.

Under `make test-fast` (RLX_TEST_FAST=1) a unit test that starts a process anyway fails, naming this file.
"""
from __future__ import annotations

import ast
import functools
import multiprocessing.process
import os
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
HELPER_DIRS = (TESTS, TESTS.parent / "scripts", TESTS.parent / "benchmarks")  # a test's helper modules (read only)

# Names (a variable, an attribute, an import) whose use starts Ray or another process.
HEAVY_NAMES = frozenset({
    "ray", "ray_local", "fit_job", "RayPPOTrainer", "init_workers",  # Ray, and the jobs that run on it
    "spawn_per_strategy", "spawn", "start_processes", "multiprocessing",  # FSDP ranks in processes of their own
    "subprocess", "Popen", "check_output", "torchrun",  # a command line
    "vllm", "LLM", "VLLMRollout",  # vLLM's engine (its CPU build starts helper processes too); also
    # build_rollout("vllm", ...), read below
    "Tracker",  # the run's loggers: the wandb and swanlab SDKs run git and a service process
})
# Tests that start a process through rlx's own code, where reading the test cannot see it.
E2E = {
    "test_model_registry.py::test_a_failing_download_names_the_command_and_the_variable": "rlx.models runs pip",
    "test_agent_loop.py::test_tool_that_raises_or_hangs_gives_an_error_text": "sync tools run in tool worker processes",
}
# Tests that start no process but take seconds each on 2 cores (the rest of the fast set takes ~0.2 s a test):
# `long`, which `make test-fast` skips too so that it stays under 3 minutes. A test file, or file::function (every
# parameter of it). tests/unit/test_hygiene.py checks that each entry names a test that exists.
LONG = {
    "test_ops.py::test_tiled_mlp_model_bitwise": "a tiny model trained under four schemes, compared bit for bit",
    "test_ops.py::test_tiled_mlp_module_rowwise_bitwise": "tiled MLP forward and backward over many tile sizes",
    "test_tiled_layer.py::test_tiled_layers_bitwise": "a tiny model's update with tiled layers, bit for bit",
    "test_tiled_layer.py::test_tiled_layers_bf16_close": "the same in bf16",
    "test_offload.py::test_rebuild_pointwise_bitwise": "offloaded training steps compared bit for bit",
    "test_offload.py::test_pool_does_not_grow": "60 offloaded micro-batches",
    "test_offload.py::test_rebuild_never_reads_saved_tensors_of_other_hooks": "offloaded training steps",
    "test_offload.py::test_fused_head_that_never_calls_the_output_projection": "offloaded training steps",
    "test_offload.py::test_skipped_layer_is_correct": "offloaded training steps",
    "test_offload.py::test_bf16_narrowed_upcasts_bitwise": "offloaded training steps in bf16, bit for bit",
    "test_optimizer_offload.py::test_optimizer_state_comes_at_the_first_step_and_leaves_at_the_end": "an update",
    "test_reward_model.py::test_score_is_read_at_the_last_valid_token": "a reward model's forward per layout",
    "test_reward_judge.py::test_judge_scores_its_own_greedy_verdicts": "HF generation of the judge's verdicts",
    "test_tiled_layer.py::test_tiled_layer_hands_down_only_exclusive_gradients": "a tiled model's backward",
    "test_tiled_layer.py::test_pool_reserved_before_first_step": "an offloaded tiled update",
    "test_agent_loop.py::test_async_single_turn_equals_sync": "HF generation, sync and async",
    "test_agent_loop.py::test_requests_are_concurrent": "concurrent HF generations",
    "test_config.py::test_not_supported_keys_exist_and_reject_non_defaults": "a config load per unsupported key",
    "test_algo_config.py::test_every_estimator_is_accepted": "a config load per estimator",
    "test_algo_config.py::test_every_kl_form_is_accepted": "a config load per KL form",
    "test_algo_config.py::test_every_loss_mode_is_accepted": "a config load per loss mode",
    "test_algo_config.py::test_every_aggregation_is_accepted_for_actor_and_critic": "a config load per mode",
    "test_sft_tool_format.py::test_warm_start_learns_a_parsable_tool_call": "fine-tunes until the model learns",
    "test_triton_head.py::test_triton_equals_torch_backend_fp32": "Triton's interpreter on the CPU",
}
# Fixtures of tests/conftest.py that start something (the module's own fixtures are read like any function).
HEAVY_FIXTURES = frozenset({"ray_local"})


def _names(node: ast.AST) -> set[str]:
    """Every name a function's code uses: variables, attributes (also as `module.attr`), imported modules and
    names, the first argument of `importorskip`."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
            if isinstance(n.value, ast.Name):
                out.add(f"{n.value.id}.{n.attr}")
        elif isinstance(n, ast.alias):
            out.update(n.name.split("."))
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.update(n.module.split("."))
        if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant) \
                and isinstance(n.args[0].value, str):
            called = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if called == "importorskip":  # pytest.importorskip("vllm")
                out.add(n.args[0].value.split(".")[0])
            elif called == "build_rollout":  # build_rollout("vllm", ...)
                out.add(n.args[0].value)
    return out


def _helper(module: str) -> Path | None:
    """The file of a helper module a test imports (`agent_helpers`, or `unit.test_x` for an e2e file's helpers)."""
    for folder in HELPER_DIRS:
        path = folder / (module.replace(".", "/") + ".py")
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=None)
def heavy_functions(path: Path) -> frozenset[str]:
    """The functions (and fixtures, methods by name) of one test file that start a process, directly or through the
    file's other functions or the heavy functions of the helper modules (tests/, scripts/, benchmarks/) it imports."""
    if path in _READING:  # helper modules that import each other
        return frozenset()
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return frozenset()
    _READING.add(path)
    try:
        return _heavy(tree)
    finally:
        _READING.discard(path)


_READING: set[Path] = set()


def _heavy(tree: ast.Module) -> frozenset[str]:
    uses: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            uses.setdefault(node.name, set()).update(_names(node))
            uses[node.name].update(a.arg for a in node.args.args)  # fixtures it takes
    imported = set()  # `name` (from helper import name) or `alias.name` (import helper as alias) heavy there
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and _helper(node.module):
            there = heavy_functions(_helper(node.module))
            imported.update(a.asname or a.name for a in node.names if a.name in there)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _helper(a.name):
                    imported.update(f"{a.asname or a.name}.{f}" for f in heavy_functions(_helper(a.name)))
    heavy = {name for name, used in uses.items() if used & (HEAVY_NAMES | HEAVY_FIXTURES | imported)}
    changed = True
    while changed:  # through the module's own helpers, to a fixed point
        changed = False
        for name, used in uses.items():
            if name not in heavy and used & heavy:
                heavy.add(name)
                changed = True
    return frozenset(heavy | imported)


def is_e2e(item) -> bool:
    if item.get_closest_marker("slow") or item.get_closest_marker("e2e"):
        return True
    if f"{Path(str(item.fspath)).name}::{getattr(item, 'originalname', None) or item.name.split('[')[0]}" in E2E:
        return True
    path = Path(str(item.fspath))
    if path.suffix != ".py":
        return False
    heavy = heavy_functions(path)
    function = getattr(item, "originalname", None) or item.name.split("[")[0]
    return function in heavy or bool(set(getattr(item, "fixturenames", ())) & (heavy | HEAVY_FIXTURES))


def is_long(item) -> bool:
    name = Path(str(item.fspath)).name
    function = getattr(item, "originalname", None) or item.name.split("[")[0]
    return name in LONG or f"{name}::{function}" in LONG


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: a test of tests/e2e: starts Ray or another process, or needs a GPU "
                                       "(applied by tests/markers.py); make test-fast runs tests/unit")
    config.addinivalue_line("markers", "long: starts no process but takes seconds (tests/markers.py LONG); "
                                       "make test-fast skips it too")


def folder(item) -> str:
    """unit | e2e: the folder of tests/ the test lives in."""
    return Path(str(item.fspath)).parent.name


def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        if folder(item) == "e2e":
            item.add_marker(pytest.mark.e2e)
        elif is_e2e(item):
            misplaced.append(item.nodeid)
        elif is_long(item):
            item.add_marker(pytest.mark.long)
    if misplaced:
        raise pytest.UsageError(f"{len(misplaced)} test(s) under tests/unit start a process or are marked e2e/slow "
                                f"(tests/markers.py): move them to tests/e2e: {', '.join(misplaced[:10])}")


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request, monkeypatch):
    """Under `make test-fast`: a unit test that starts a process fails, saying so."""
    if not os.environ.get("RLX_TEST_FAST") or any(request.node.get_closest_marker(m) for m in ("e2e", "gpu")):
        yield
        return

    def refuse(*args, **kwargs):
        pytest.fail(f"{request.node.nodeid} starts a process but lives in tests/unit: tests/markers.py did not see "
                    f"it (move it to tests/e2e, and add the name it starts the process with to HEAVY_NAMES)",
                    pytrace=True)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    yield
