"""tests/isolation.py: what a test leaves behind fails that test, and is undone; library writes are left alone."""
import os

import isolation
from conftest import REPO


def test_writes_are_attributed_to_the_file_that_made_them(tmp_path, monkeypatch):
    lib = tmp_path / "some_library.py"
    lib.write_text("import os\n\ndef configure():\n    os.environ.setdefault('RLX_TEST_LIBRARY_KEY', '1')\n"
                   "    os.environ.update({'RLX_TEST_LIBRARY_KEY2': '1'})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import some_library

    before = dict(os.environ)
    try:
        some_library.configure()
        os.environ["RLX_TEST_OWN_KEY"] = "1"
        assert isolation.WRITERS["RLX_TEST_OWN_KEY"] == __file__
        assert isolation.WRITERS["RLX_TEST_LIBRARY_KEY"] == isolation.WRITERS["RLX_TEST_LIBRARY_KEY2"] == str(lib)
        changed = isolation.restore_env(before)
        assert changed == [f"+RLX_TEST_OWN_KEY (by {os.path.relpath(__file__, REPO)})"]
        assert "RLX_TEST_OWN_KEY" not in os.environ and os.environ["RLX_TEST_LIBRARY_KEY"] == "1"
    finally:
        for k in ("RLX_TEST_OWN_KEY", "RLX_TEST_LIBRARY_KEY", "RLX_TEST_LIBRARY_KEY2"):
            os.environ.pop(k, None)


LEAKY = '''
import os

import pytest
import torch


@pytest.mark.slow
def test_sets_a_variable():
    os.environ["MASTER_PORT"] = "29999"


@pytest.mark.slow
def test_leaves_a_process_group():
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)


def test_unchecked():
    os.environ["RLX_UNCHECKED"] = "1"


@pytest.mark.slow
def test_clean_afterwards():
    assert "MASTER_PORT" not in os.environ and not torch.distributed.is_initialized()
'''


def test_one_rank_group_leaves_nothing_behind():
    import torch

    from conftest import one_rank_group

    before = dict(os.environ)
    with one_rank_group("cpu") as device:
        assert torch.distributed.get_world_size() == 1 and device == torch.device("cpu")
    assert not torch.distributed.is_initialized() and dict(os.environ) == before
