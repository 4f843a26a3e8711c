"""Every leaf key of the schema does what it says or is refused (the README's promise: a verl key rlx does not
implement is an error, never a silent no-op).

A key is accounted for when the code that runs a job reads it (recorded by tests/key_recording.py: a tiny job in
one process with a config that records every field read, validation's own reads excluded), when its schema
default interpolates into a key that is read (trainer.project_name -> trainer.default_local_dir), or when it is
listed: `NOT_SUPPORTED` (refused unless default), `DEPRECATED` (turned into the per-GPU key that replaces it, as
verl does), `FOLLOWS` (refused unless equal to the key it mirrors), `NO_OP_BY_DESIGN` (accepted, with the reason),
`ALIASES` (verl 0.9.1's `reward.*` spelling of a legacy key, moved onto it at load).
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from rlx.config.loader import SCHEMA_KEYS, SECTION_KEYS
from rlx.config.reward import ALIASES
from rlx.config.schema import RLXConfig
from rlx.config.verl_compat import DEPRECATED, FOLLOWS, NO_OP_BY_DESIGN, NOT_SUPPORTED

from conftest import REPO, load_config  # load_config: the quickstart job's config

LEAVES = sorted(SCHEMA_KEYS - SECTION_KEYS)
LISTS = {"NOT_SUPPORTED": NOT_SUPPORTED, "DEPRECATED": DEPRECATED, "FOLLOWS": FOLLOWS,
         "NO_OP_BY_DESIGN": NO_OP_BY_DESIGN, "ALIASES": ALIASES}


@pytest.fixture(scope="module")
def reads(tmp_path_factory) -> dict[str, list[str]]:
    """{key: files that read it} from the recording run (about 10 s)."""
    out = tmp_path_factory.mktemp("keys") / "reads.json"
    proc = subprocess.run([sys.executable, "tests/key_recording.py", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"the recording run failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())["reads"]


def interpolated_into() -> dict[str, list[str]]:
    """key -> the keys whose schema default interpolates it (`${key}`)."""
    out: dict[str, list[str]] = {}

    def walk(obj, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            elif isinstance(value, str):
                for source in re.findall(r"\$\{([^}]+)\}", value):
                    out.setdefault(source, []).append(prefix + f.name)

    walk(RLXConfig(), "")
    return out


def test_lists_name_real_keys_once():
    for name, keys in LISTS.items():
        assert set(keys) <= set(LEAVES), f"{name} names keys the schema does not have: {set(keys) - set(LEAVES)}"
    names = list(LISTS)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not set(LISTS[a]) & set(LISTS[b]), f"{a} and {b} both list {set(LISTS[a]) & set(LISTS[b])}"
    for key, reason in NO_OP_BY_DESIGN.items():
        assert reason.strip(), f"NO_OP_BY_DESIGN[{key!r}] needs its reason"
    for key, replacement in DEPRECATED.items():
        assert replacement in LEAVES, replacement


@pytest.mark.parametrize("key", sorted(FOLLOWS))
def test_follower_keys_are_refused_unless_they_follow(key):
    source = FOLLOWS[key]
    assert key in interpolated_into()[source], f"{key}'s default must interpolate {source}"
    load_config([f"{source}=24"])  # the follower follows
    with pytest.raises(ValueError, match=rf"{re.escape(key)}=40 differs from {re.escape(source)}=16"):
        load_config([f"{key}=40"])


@pytest.mark.parametrize("key", sorted(DEPRECATED))
def test_deprecated_keys_are_refused_next_to_their_replacement(key):
    """Alone, a deprecated key sets its replacement (tests/unit/test_verl_leniency.py); with it, it is refused."""
    with pytest.raises(ValueError, match=rf"{re.escape(key)}=4 and {re.escape(DEPRECATED[key])}=2 are both set"):
        load_config([f"{key}=4", f"{DEPRECATED[key]}=2"])
