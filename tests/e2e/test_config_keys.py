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
