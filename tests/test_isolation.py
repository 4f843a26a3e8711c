"""tests/isolation.py: what a test leaves behind fails that test, and is undone; library writes are left alone."""
import os
import subprocess
import sys
import textwrap

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


def test_a_leaking_test_errors_at_its_teardown_and_is_undone(tmp_path):
    from conftest import free_port

    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        from isolation import each_module_isolated, each_test_isolated, track_env_writers  # noqa: F401
        track_env_writers()

        def pytest_configure(config):
            config.addinivalue_line("markers", "slow: checked by tests/isolation.py")
    """))
    (tmp_path / "test_leaky.py").write_text(LEAKY.format(port=free_port()))
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "tests"), REPO, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "ERROR at teardown of test_sets_a_variable" in out, out
    assert "test test_sets_a_variable changed os.environ (restored): +MASTER_PORT (by" in out, out
    assert "test test_leaves_a_process_group left the default torch.distributed process group initialised" in out, out
    # an unchecked test (not gpu, slow or on the shared Ray) is not checked itself, but its module is, at its end
    assert "module test_leaky changed os.environ (restored): +RLX_UNCHECKED (by test_leaky.py)" in out, out
    assert "4 passed, 3 errors" in out, out  # the last test passes: what came before it was undone


def test_one_rank_group_leaves_nothing_behind():
    import torch

    from conftest import one_rank_group

    before = dict(os.environ)
    with one_rank_group("cpu") as device:
        assert torch.distributed.get_world_size() == 1 and device == torch.device("cpu")
    assert not torch.distributed.is_initialized() and dict(os.environ) == before
