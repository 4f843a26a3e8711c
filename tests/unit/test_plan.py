"""The job plan (rlx.plan): what `make_plan` resolves for the main kinds of job, and that nothing else re-decides it.

The source checks parse every module under rlx/ with `ast` (nothing is imported): the engine names are compared only
in rlx/plan.py and the rollout factory (rlx/workers/rollout/__init__.py), and each role predicate is written in
rlx/plan.py only (rlx/config/ may still read the keys it validates).
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import rlx
from rlx.plan import make_plan, plan_roles

from conftest import load_config  # the quickstart job: GRPO, 2 workers

ROOT = Path(rlx.__file__).parent
RM = ["reward_model.enable=True", "reward_model.model.path=builtin://tiny-qwen2-rm"]
JUDGE = ["reward_model.enable=True", "reward_model.model.path=builtin://tiny-qwen2", "reward_model.judge.enable=True"]
CPU = ["trainer.device=cpu"]


def plan_of(overrides=(), vllm=False):
    return make_plan(load_config(CPU + list(overrides)), vllm_installed=lambda: vllm)


def test_roles_are_pure_and_the_plan_pickles():
    import pickle

    cfg = load_config(CPU + ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=True"])
    assert plan_roles(cfg) == make_plan(cfg).roles
    plan = make_plan(cfg)
    assert pickle.loads(pickle.dumps(plan)) == plan  # it travels to the workers with their arguments
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.roles = None


# ---------------------------------------------------------------------------------------------- nobody re-decides
ENGINE_NAMES = {"vllm", "hf"}
ENGINE_DECIDERS = {"rlx/plan.py", "rlx/config/roles.py", "rlx/workers/rollout/__init__.py"}


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        yield path.relative_to(ROOT.parent).as_posix(), ast.parse(path.read_text())


def _strings(node) -> set:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _engine_compares(tree) -> list[int]:
    """Lines comparing a value with "vllm"/"hf" (==, !=, is) or testing it against a literal collection of them."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for left, op, right in zip([node.left] + node.comparators, node.ops, node.comparators):
            if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
                sides = {s.value for s in (left, right) if isinstance(s, ast.Constant)}
                if sides & ENGINE_NAMES:
                    lines.append(node.lineno)
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                if _strings(right) & ENGINE_NAMES:
                    lines.append(node.lineno)
    return lines


def _attrs(node) -> set:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _role_predicates(tree) -> list[tuple[int, str]]:
    """Lines where a role is decided from the config: critic (adv_estimator compared with "gae"), ref (use_kl_loss
    or use_kl_in_reward), reward model (its enable with custom_reward_function), the reward model's own pool
    (enable_resource_pool), the judge (judge.enable), the agent loop (uses_agent_loop)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and "gae" in _strings(node) and "adv_estimator" in _attrs(node):
            found.append((node.lineno, "critic"))
        elif isinstance(node, ast.BoolOp):
            attrs = _attrs(node)
            if {"use_kl_loss", "use_kl_in_reward"} <= attrs:
                found.append((node.lineno, "ref"))
            if {"enable", "custom_reward_function"} <= attrs:
                found.append((node.lineno, "reward model"))
        elif isinstance(node, ast.Attribute) and node.attr == "enable_resource_pool":
            found.append((node.lineno, "reward model pool"))
        elif isinstance(node, ast.Attribute) and node.attr == "enable" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "judge":
            found.append((node.lineno, "judge"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == \
                "uses_agent_loop":
            found.append((node.lineno, "agent loop"))
    return found


def test_engine_names_are_compared_only_by_the_plan_and_the_rollout_factory():
    bad = [f"{name}:{line}" for name, tree in _modules() if name not in ENGINE_DECIDERS
           for line in _engine_compares(tree)]
    assert not bad, f"compare engine names in rlx/plan.py or the rollout factory only; read the plan: {bad}"


def test_role_predicates_are_written_in_the_plan_only():
    """Validation (rlx/config/) may read a key it checks (judge.enable, enable_resource_pool, the agent loop's
    switches), never decide the ref, critic or reward-model role itself."""
    bad = []
    for name, tree in _modules():
        if name in ("rlx/config/roles.py", "rlx/plan.py"):  # the roles; the plan (the rollout mode)
            continue
        for line, role in _role_predicates(tree):
            if name.startswith("rlx/config/") and role in ("reward model pool", "judge", "agent loop"):
                continue
            bad.append(f"{name}:{line} ({role})")
    assert not bad, f"role predicates outside rlx/config/roles.py (read plan.roles / rlx.plan.plan_roles): {bad}"


def test_no_rollout_name_travels():
    bad = [f"{name}:{getattr(n, 'lineno', '?')}" for name, tree in _modules() for n in ast.walk(tree)
           if (isinstance(n, ast.arg) and n.arg == "rollout_name") or (isinstance(n, ast.Name) and n.id ==
               "rollout_name") or (isinstance(n, ast.Attribute) and n.attr == "rollout_name")]
    assert not bad, bad


def test_the_checks_see_what_they_look_for():
    src = ("a = x == 'vllm'\nb = y in ('hf', 'naive')\nc = name not in ENGINES\nd = 'vllm' in kwargs\n"
           "e = cfg.algorithm.adv_estimator != 'gae'\nf = a.use_kl_loss or b.use_kl_in_reward\n"
           "g = rm.enable and not cfg.custom_reward_function.path\nh = rm.judge.enable\ni = rm.enable_resource_pool\n"
           "j = uses_agent_loop(r)\n")
    tree = ast.parse(src)
    assert _engine_compares(tree) == [1, 2]
    assert [role for _, role in sorted(_role_predicates(tree))] == [
        "critic", "ref", "reward model", "judge", "reward model pool", "agent loop"]
