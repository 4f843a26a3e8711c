"""Layers point one way: no module of rlx imports one of a higher layer (README.md, "A tour of the code").

Every module under rlx/ is parsed with `ast` (no import runs); each `import` / `from ... import` of an rlx module,
at the top of a file or inside a function, is checked against the layer table below. A new package must be given
a layer here before its first import passes, so where it sits is a decision, not an accident.
"""
from __future__ import annotations

import ast
from pathlib import Path

import rlx

ROOT = Path(rlx.__file__).parent

# (module prefix, layer); the longest matching prefix wins. A module may import its own layer and those below.
LAYERS = [
    # 0: leaves that import nothing else of rlx
    ("rlx", 0),                    # the package itself (empty)
    ("rlx.algos", 0),              # pure tensor math: advantages, losses, KL, metrics
    ("rlx.protocol", 0),           # the batch container that crosses the Ray boundary
    ("rlx.models", 0),             # built-in model directories (config's validation reads their layer count)
    ("rlx.verl_names", 0),         # verl's import names for users' files; its rlx targets are named by string
    # 1: typed config, loading, validation, device defaults
    ("rlx.config", 1),
    ("rlx.plan", 1),               # the job plan, resolved once from the config (validation reads its roles)
    # 2: plain-Python machinery that runs without Ray (also under torchrun)
    ("rlx.engine", 2),             # FSDP engines, weights gathering, batch packing, sequence parallelism
    ("rlx.offload", 2),
    ("rlx.ops", 2),
    ("rlx.data", 2),
    ("rlx.reward", 2),             # how a response is scored: rules, custom functions, manager, reward-model inputs
    # 3: sharded checkpoints of an engine, HF export (read by the workers, reads the engine)
    ("rlx.checkpoint", 3),         # the manager, store, engine state, export, safe loading, the run lock
    # 4: Ray worker roles, their group, and the rollouts they hold
    ("rlx.workers", 4),
    # 5: the driver: the loop, the Ray launch, the preflight
    ("rlx.trainer", 5),
    # 6: the command line, and verl's module name for it
    ("rlx.trainer.cli", 6),
    ("rlx.trainer.main_ppo", 6),
]
LAYER_NAMES = {0: "leaves", 1: "config", 2: "engine", 3: "checkpoint", 4: "workers", 5: "trainer", 6: "entry point"}

# (importing module, imported module) -> why the upward import is needed. Keep it empty if at all possible.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").exists() or (ROOT.parent / rel / "__init__.py").exists()


def imported_modules(source: str, name: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, rlx module) of every import in the source of module `name`; `from pkg import mod` names the
    submodule when there is one."""
    package = name if is_package else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "rlx"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "rlx":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((node.lineno, sub if is_module(sub) else base))
    return sorted(out)


def imports(path: Path, name: str) -> list[tuple[int, str]]:
    return imported_modules(path.read_text(), name, path.name == "__init__.py")


def all_modules() -> list[tuple[Path, str]]:
    return [(p, module_name(p)) for p in sorted(ROOT.rglob("*.py"))]


def test_every_module_has_a_layer():
    missing = [name for _, name in all_modules() if layer_of(name) is None]
    assert not missing, f"give these modules a layer in tests/unit/test_layers.py LAYERS: {missing}"


def test_no_upward_imports():
    bad = []
    for path, name in all_modules():
        src = layer_of(name)
        for line, target in imports(path, name):
            dst = layer_of(target)
            if dst is not None and src is not None and dst > src and (name, target) not in ALLOWED_UPWARD:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {name} ({LAYER_NAMES[src]}) imports "
                           f"{target} ({LAYER_NAMES[dst]})")
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


def test_allow_list_is_not_stale():
    """Every allowed upward import still exists (remove an entry once its import is gone)."""
    found = {(name, target) for path, name in all_modules() for _, target in imports(path, name)}
    stale = [pair for pair in ALLOWED_UPWARD if pair not in found]
    assert not stale, stale


def test_checker_sees_upward_imports():
    """The checker itself: a relative import, a function-local import and `from pkg import submodule`."""
    assert layer_of("rlx.workers.rollout.hf_rollout") == 4 and layer_of("rlx.engine.fsdp") == 2
    assert layer_of("rlx.checkpoint") == 3
    assert layer_of("rlx.algos.core_algos") == 0 and layer_of("rlxfoo") is None
    source = "from ..rollout import base\ndef f():\n    from rlx.trainer import ppo_trainer\nfrom rlx import checkpoint\n"
    found = [t for _, t in imported_modules(source, "rlx.workers.rollout.hf_rollout", is_package=False)]
    assert found == ["rlx.workers.rollout.base", "rlx.trainer.ppo_trainer", "rlx.checkpoint"], found
