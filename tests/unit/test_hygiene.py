"""The test suite's own rules: `importorskip` only for optional extras; tests/unit holds no test that starts a process
(tests/markers.py reads them), so that `make test-fast` runs none; its `long` list names real tests. And one rule of
the package: no module of rlx/ is longer than 500 lines."""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import markers
from conftest import REPO

TESTS = Path(REPO) / "tests"


def required_dependencies() -> set[str]:
    """The import names of pyproject's `dependencies` (not the optional extras)."""
    text = (Path(REPO) / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    names = {re.split(r"[<>=\[ ;]", q, maxsplit=1)[0].lower() for q in re.findall(r'"([^"]+)"', block)}
    return {n.replace("-", "_") for n in names} | {"torch", "pytest"}


def test_importorskip_only_for_optional_extras():
    required = required_dependencies()
    bad = []
    for path in sorted(TESTS.glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                module = str(node.args[0].value).split(".")[0]
                if module in required:
                    bad.append(f"{path.relative_to(TESTS)}:{node.lineno} importorskip({module!r})")
    assert not bad, (f"{bad}: these are dependencies of rlx (pyproject.toml), so a missing one is a broken install "
                     f"that must fail, not skip. Fix: import them plainly.")


def _write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_e2e_is_found_through_helpers_fixtures_and_helper_modules(tmp_path, monkeypatch):
    monkeypatch.setattr(markers, "HELPER_DIRS", (tmp_path,))
    markers.heavy_functions.cache_clear()
    _write(tmp_path, "helper_mod.py", """
        import subprocess
        def run_cli(args):
            return subprocess.run(args)
        def pure(x):
            return x + 1
    """)
    path = _write(tmp_path, "test_sample.py", """
        import pytest
        from conftest import fit_job, spawn_per_strategy
        from helper_mod import run_cli, pure
        import helper_mod as h

        def _train(tmp):
            return fit_job([], tmp)

        def _twice(tmp):
            return _train(tmp), _train(tmp)

        @pytest.fixture(scope="module")
        def history(tmp_path_factory):
            return _twice(tmp_path_factory.mktemp("x"))

        def test_math():
            assert pure(1) == 2

        def test_through_helpers(tmp_path):
            _twice(tmp_path)

        def test_through_fixture(history):
            assert history

        def test_on_ray(ray_local):
            pass

        def test_ranks(tmp_path):
            spawn_per_strategy(print, str(tmp_path))

        def test_cli():
            run_cli(["true"])

        def test_vllm():
            pytest.importorskip("vllm")

        def test_vllm_rollout():
            from rlx.workers.rollout import build_rollout
            build_rollout("vllm", model_path="m")

        def test_hf_rollout():
            from rlx.workers.rollout import build_rollout
            build_rollout("hf", model_path="m")

        def test_module_attr():
            h.run_cli(["true"])

        def test_module_pure():
            assert h.pure(1) == 2

        def test_loggers():
            from rlx.trainer.tracking import Tracker
            Tracker(None, "logs")
    """)
    heavy = markers.heavy_functions(path)
    markers.heavy_functions.cache_clear()
    assert "test_math" not in heavy and "pure" not in heavy
    assert {"_train", "_twice", "history", "test_through_helpers", "test_ranks", "test_cli", "test_vllm"} <= heavy
    assert "test_through_fixture" in heavy and "run_cli" in heavy  # the fixture it takes; the helper module's
    assert "test_on_ray" in heavy
    assert {"test_module_attr", "test_loggers", "test_vllm_rollout"} <= heavy
    assert not {"test_module_pure", "test_hf_rollout"} & heavy


def test_known_files_are_classified():
    """Spot checks on the real suite: an end-to-end file is all e2e (also where its helpers live in the unit half of
    its file), a pure-math file has none."""
    for name in ("test_e2e.py", "test_async_training.py"):
        assert _test_names(TESTS / "e2e" / name) <= markers.heavy_functions(TESTS / "e2e" / name), name
    assert not _test_names(TESTS / "unit" / "test_core_algos.py") & markers.heavy_functions(
        TESTS / "unit" / "test_core_algos.py")


def test_every_test_file_is_in_unit_or_e2e():
    """tests/ itself holds only conftest and helper modules: each test file is in tests/unit or tests/e2e."""
    stray = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not stray, f"{stray}: put each in tests/unit (runs in the pytest process alone) or tests/e2e (starts Ray " \
                      f"or another process, or needs a GPU)"


def _test_names(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_each_long_entry_names_a_test():
    for entry in [*markers.LONG, *markers.E2E]:
        name, _, function = entry.partition("::")
        path = TESTS / ("unit" if entry in markers.LONG else "e2e") / name
        assert path.is_file(), f"markers.LONG/E2E names {name}, which is not a test file. Fix: correct or drop it"
        if function:
            assert function in _test_names(path), f"markers.LONG/E2E names {entry}, which does not exist. Fix: " \
                                                  f"correct it"


MAX_MODULE_LINES = 500
# Modules that are being split right now, each in its own change (issue 37: the checkpoint package, the trainer's
# phases, the algorithms); each leaves this list when its split lands. Do not add to it: split the module instead.
BEING_SPLIT: tuple[str, ...] = ()


def test_no_rlx_module_over_500_lines():
    rlx_dir = Path(REPO) / "rlx"
    long = {str(p.relative_to(REPO)): n for p in sorted(rlx_dir.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    over = sorted(k for k in long if k not in BEING_SPLIT)
    assert not over, (f"{[f'{k}: {long[k]} lines' for k in over]} over {MAX_MODULE_LINES} lines. Fix: split the module "
                      f"by what it does (as rlx/config/ has one module per config section).")


def _crash(rank: int, strategy: str, root: str) -> None:
    """Rank 1 dies of SIGSEGV in its first check."""
    import os
    import signal

    if rank == 1 and strategy == "fsdp":
        os.kill(os.getpid(), signal.SIGSEGV)
