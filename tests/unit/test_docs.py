"""The README and docs/ agree with the code: every generated table of keys and defaults (scripts/gen_docs.py) is what
the schema renders now; every config key a doc names exists; the algorithm tables list exactly the values the code
accepts; the README's make targets exist. (tests/unit/test_readme.py keeps the README short and its links true.)"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import REPO

ROOT = Path(REPO)
sys.path.insert(0, str(ROOT / "scripts"))
import gen_docs  # noqa: E402

README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
TOP_SECTIONS = ("data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function", "algorithm",
                "trainer", "ray_init", "global_profiler")
# Dotted names in the docs that are not rlx keys, on purpose.
NOT_KEYS = {
    "actor_rollout_ref.model.enable_activation_offloading": "the misspelled key of the 'Did you mean' example",
    "data.max_": "short for data.max_prompt_length / data.max_response_length",
    "reward_model.ground_truth": "a column of verl's rows, not a key",
    "actor_rollout_ref.model.torch_dtype": "a key of verl's scripts that verl 0.9.1 lacks too",
    "reward_model.sandbox_fusion": "an older verl's section, refused",
    "reward_model.sandbox_fusion.url": "an older verl's key, refused",
    "data.sampler": "verl's curriculum-sampler section, which rlx does not have (verl_commands.md lists it)",
    "data.return_multi_modal_inputs": "a verl key rlx does not have (verl_commands.md lists it)",
    "trainer.tensorboard_dir": "a key of a recipe script that rlx does not have (verl_commands.md lists it)",
}


def test_readme_commands_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test", "test-fast"):
        assert f"make {target}" in README
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"Makefile has no target {target}"


def test_generated_tables_match_the_schema():
    stale = gen_docs.stale(ROOT)
    assert not stale, f"generated tables in {stale} differ from rlx/config/schema.py. Fix: python scripts/gen_docs.py"


def test_gen_docs_refuses_an_unknown_key():
    with pytest.raises(ValueError, match=r"no key 'trainer.nope'.*Fix:"):
        gen_docs.regenerate("<!-- gen:keys trainer.nope -->\n<!-- /gen -->", "x.md")


def test_every_key_a_doc_names_exists():
    """A dotted key in backticks (`trainer.save_freq`, `+data.x=...`) is a key of the schema, or lies inside a
    free-form dict key (`data.custom_cls.path`), or is one of NOT_KEYS."""
    bad = {}
    for name, text in {"README.md": README, **{f"docs/{k}": v for k, v in DOCS.items()}}.items():
        for m in re.finditer(r"`\+?((?:%s)\.[A-Za-z0-9_.]+)" % "|".join(TOP_SECTIONS), text):
            key = m.group(1).rstrip(".")
            if key in NOT_KEYS or _in_free_form_dict(key):
                continue
            try:
                gen_docs.lookup(key)
            except ValueError:
                bad.setdefault(name, set()).add(key)
    assert not bad, f"keys the schema does not have: {bad}"


def _in_free_form_dict(key: str) -> bool:
    parts = key.split(".")
    for i in range(1, len(parts)):
        try:
            default, _, _ = gen_docs.lookup(".".join(parts[:i]))
        except ValueError:
            return False
        if isinstance(default, dict):
            return True
    return False


def _table_values(doc: str, heading: str) -> set[str]:
    """The backticked values of the first column of the table under `heading`."""
    section = doc.split(heading, 1)[1].split("\n## ", 1)[0]
    values = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            values.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return values


def test_algorithm_tables_list_every_value():
    from rlx.algos.advantages import ADV_ESTIMATORS
    from rlx.algos.core_algos import KL_PENALTY_TYPES, LOSS_AGG_MODES
    from rlx.algos.policy_losses import LOSS_MODES

    doc = DOCS["algorithms.md"]
    assert _table_values(doc, "## `algorithm.adv_estimator`") == set(ADV_ESTIMATORS)
    assert _table_values(doc, "## `actor_rollout_ref.actor.policy_loss.loss_mode`") == set(LOSS_MODES)
    assert _table_values(doc, "## `loss_agg_mode`") == set(LOSS_AGG_MODES)
    kl = _table_values(doc, "## KL estimators")
    assert {v for v in KL_PENALTY_TYPES if not v.endswith("+")} <= kl
    assert all(v.endswith("+") or v in kl for v in KL_PENALTY_TYPES)
