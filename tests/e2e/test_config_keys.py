"""End-to-end half of tests/unit/test_config_keys.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
from rlx.config.verl_compat import NO_OP_BY_DESIGN
from unit.test_config_keys import LEAVES, LISTS, interpolated_into
from unit.test_config_keys import reads  # noqa: F401 -- fixtures


def test_every_leaf_key_is_read_or_refused(reads):
    through = interpolated_into()
    listed = set().union(*LISTS.values())
    unaccounted = [key for key in LEAVES if key not in reads and key not in listed
                   and not any(user in reads for user in through.get(key, []))]
    assert unaccounted == [], (
        f"{len(unaccounted)} key(s) are accepted but nothing reads them (a silent no-op): {unaccounted}. Implement "
        f"each (and let tests/key_recording.py's job reach the code that reads it), or refuse non-default values "
        f"(rlx/config/verl_compat.py: NOT_SUPPORTED), or -- only if the key cannot change what is computed -- list it in "
        f"NO_OP_BY_DESIGN with the reason.")


def test_no_op_keys_are_really_not_read(reads):
    read = sorted(set(NO_OP_BY_DESIGN) & set(reads))
    assert read == [], f"{read} are listed in NO_OP_BY_DESIGN but the code reads them ({[reads[k] for k in read]}): " \
                       f"remove them from the list (and document what they do)"
