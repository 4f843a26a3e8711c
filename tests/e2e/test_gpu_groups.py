"""End-to-end half of tests/unit/test_gpu_groups.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from gpu_groups import GROUPS, group_of, matches
from unit.test_gpu_groups import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _collected_gpu_tests,
)


def test_every_gpu_test_is_in_exactly_one_group():
    nodeids, skipped_files = _collected_gpu_tests()
    assert len(nodeids) >= 40, nodeids
    wrong = {n: group_of(n) for n in nodeids if len(group_of(n)) != 1}
    assert not wrong, f"GPU tests in no group or in several (tests/gpu_groups.py): {wrong}"
    for k, g in GROUPS.items():
        for t in g.tests:
            assert t.split("::")[0] in skipped_files or any(matches(n, t) for n in nodeids), \
                f"group {k}: {t} names no GPU test"
