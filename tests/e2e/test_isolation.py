"""End-to-end half of tests/unit/test_isolation.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
import os
import subprocess
import sys
import textwrap
from conftest import REPO
from unit.test_isolation import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    LEAKY,
)


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
