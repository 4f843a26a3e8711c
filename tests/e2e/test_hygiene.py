"""The spawn helper's own rule (tests/conftest.py `spawn_per_strategy`): a rank that dies fails the test."""
from __future__ import annotations

from unit.test_hygiene import _crash


def test_a_rank_killed_by_a_signal_fails_the_test_with_its_stacks(tmp_path):
    """A rank killed by a native crash fails the test at once (no rerun), and the failure carries the crashed
    rank's Python stacks, written by faulthandler, so that the crash says where it happened."""
    import pytest

    from conftest import spawn_per_strategy

    with pytest.raises(AssertionError, match=r"(?s)rank 1 died \(SIGSEGV\); its stacks.*Segmentation fault.*in _crash"):
        spawn_per_strategy(_crash, str(tmp_path))
