"""swanlab (`trainer.logger=[console,swanlab]`, used by verl's example scripts), the optional extra `rlx[swanlab]`:
without an API key the run logs offline into its own folder and says so in one line, touching no network; with a key
it logs online; without the package, validation names the logger and the install command before Ray starts.

The network check is real: swanlab's API address (SWANLAB_API_HOST) and the HTTP(S) proxy variables point at a
listener of the wandb tests, which records the connections it gets. The offline run is read back from its `.swanlab`
file with swanlab's own reader and protobuf records.
"""
from __future__ import annotations

import glob
import importlib.util
import os

import pytest

from conftest import load_config
from unit.test_tracking_wandb import Listener, apply_env

# the extra the project's setup installs (scripts/setup.sh); the refusal test at the end runs without it
needs_swanlab = pytest.mark.skipif(importlib.util.find_spec("swanlab") is None, reason="swanlab is not installed")

KEY = "s" * 21 + "wanlabkey"


def isolated_env(tmp_path, listener: Listener, key: str | None = None) -> dict:
    """No key anywhere (unless `key`), swanlab's saved login under tmp_path, every swanlab / HTTP(S) address at the
    listener."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SWANLAB_") and k.upper() not in ("NO_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
    env.update({"SWANLAB_ROOT": str(tmp_path / "swanlab-root"), "SWANLAB_API_HOST": listener.url,
                "SWANLAB_WEB_HOST": listener.url, "HTTP_PROXY": listener.url, "HTTPS_PROXY": listener.url,
                "http_proxy": listener.url, "https_proxy": listener.url})
    if key:
        env["SWANLAB_API_KEY"] = key
    return env


def records(run_dir: str) -> list:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    files = glob.glob(os.path.join(run_dir, "*.swanlab"))
    assert len(files) == 1, os.listdir(run_dir)
    reader = DataStoreReader()
    reader.open(files[0])
    out = []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        out.append(record)
    reader.close()
    return out


def offline_run_dir(stderr: str, root: str) -> str:
    """The run folder the one `rlx: swanlab` line names; checks it is the only such line and the one on disk."""
    lines = [line for line in stderr.splitlines() if line.startswith("rlx: swanlab")]
    assert len(lines) == 1, stderr
    runs = glob.glob(os.path.join(root, "run-*"))
    assert len(runs) == 1, runs
    assert "offline" in lines[0] and f"swanlab sync {runs[0]}" in lines[0], lines[0]
    return runs[0]


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@needs_swanlab
def test_credentials_are_found_where_swanlab_login_puts_them(tmp_path, monkeypatch, listener):
    from rlx.trainer.tracking import swanlab_has_credentials

    apply_env(monkeypatch, isolated_env(tmp_path, listener))
    assert not swanlab_has_credentials()
    netrc = tmp_path / "swanlab-root" / ".netrc"  # where `swanlab login` saves the key (SWANLAB_ROOT)
    netrc.parent.mkdir()
    netrc.write_text(f"machine {listener.url}\n  login {listener.url}\n  password {KEY}\n")
    netrc.chmod(0o600)
    assert swanlab_has_credentials()
    netrc.unlink()
    monkeypatch.setenv("SWANLAB_API_KEY", KEY)
    assert swanlab_has_credentials()


ONLINE_CHILD = """
import sys
from rlx.config import load_config
from rlx.trainer.tracking import init_swanlab
cfg = load_config(["trainer.logger=[console,swanlab]", "trainer.default_local_dir=" + sys.argv[1]],
                  config_name="quickstart")
print("starting", flush=True)
init_swanlab(cfg, sys.argv[1])
"""


def test_validation_refuses_swanlab_when_missing(monkeypatch):
    """Without the package: one error naming the logger and the install command, from the preflight's probes
    (before Ray; validation does no IO)."""
    from conftest import refusal

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab"
                        else real(name, *a))
    msg = refusal(["trainer.logger=[console,swanlab]"])
    assert "trainer.logger=swanlab" in msg and "pip install swanlab" in msg
    monkeypatch.undo()
    assert load_config(["trainer.logger=[console,swanlab]"]).trainer.logger == ["console", "swanlab"]
