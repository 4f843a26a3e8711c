"""wandb out of the box (`trainer.logger=[console,wandb]`, verl's default): without an API key the run logs offline into
its own folder and says so in one line, touching no network; with a key it logs online.

The network check is real: W&B's API address (WANDB_BASE_URL) and the HTTP(S) proxy variables point at a listener
of this test, which counts the connections it gets (zero offline; the online run's first request carries the key).
The offline run is read back from its `.wandb` file (LevelDB-style log of wandb's protobuf records).
"""
from __future__ import annotations

import glob
import json
import os
import socket
import struct
import threading
import time

import pytest

from conftest import load_config

KEY = "local-" + "k" * 40  # a well-formed API key (wandb checks the format before using it)


class Listener:
    """A TCP server on 127.0.0.1 that records the first bytes of every connection (an HTTP request line)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[bytes] = []
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            conn.settimeout(2)
            try:
                self.requests.append(conn.recv(65536))
            except OSError:
                self.requests.append(b"")
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def isolated_env(tmp_path, listener: Listener, key: str | None = None) -> dict:
    """No key anywhere (unless `key`), no netrc, wandb's settings under tmp_path, every W&B / HTTP(S) address at
    the listener."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WANDB_") and k.upper() not in ("NO_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
    env.update({"NETRC": str(tmp_path / "no-netrc"), "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
                "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
                "WANDB_BASE_URL": listener.url, "HTTP_PROXY": listener.url, "HTTPS_PROXY": listener.url,
                "http_proxy": listener.url, "https_proxy": listener.url})
    if key:
        env["WANDB_API_KEY"] = key
    return env


def apply_env(monkeypatch, env: dict) -> None:
    for k in list(os.environ):
        if k not in env:
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def wandb_records(path: str):
    """The protobuf records of a `.wandb` file: a 7-byte W&B header, then LevelDB log records in 32 KiB blocks
    (4-byte CRC, 2-byte length, 1-byte type: 1 full, 2 first, 3 middle, 4 last). Stops before a record that is
    not all on disk yet."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:8]
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # block trailer / zero padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # a record wandb's service is still writing: read it next time
            return
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


def finished_records(run_dir: str, timeout: float = 60.0) -> list:
    """The records of the run's `.wandb` file once it holds the run's exit record (wandb's service process may still
    be writing when `finish()` returns)."""
    files = glob.glob(os.path.join(run_dir, "*.wandb"))
    assert len(files) == 1, os.listdir(run_dir)
    deadline = time.monotonic() + timeout
    while True:
        records = list(wandb_records(files[0]))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def history(run_dir: str) -> list[dict]:
    """The rows logged with run.log, as {key: value} (wandb's own `_runtime`, `_timestamp` dropped)."""
    rows = []
    for r in finished_records(run_dir):
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            rows.append({k: v for k, v in row.items() if k not in ("_runtime", "_timestamp")})
    return rows


def run_record(run_dir: str):
    return next(r.run for r in finished_records(run_dir) if r.WhichOneof("record_type") == "run")


def offline_run_dir(stderr: str, wandb_root: str) -> str:
    """The run folder the one `rlx: wandb` line names; checks it is the only such line and the one on disk."""
    lines = [line for line in stderr.splitlines() if line.startswith("rlx: wandb")]
    assert len(lines) == 1, stderr
    runs = glob.glob(os.path.join(wandb_root, "wandb", "offline-run-*"))
    assert len(runs) == 1, runs
    assert "offline" in lines[0] and f"wandb sync {runs[0]}" in lines[0], lines[0]
    return runs[0]


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def test_credentials_are_found_where_wandb_login_puts_them(tmp_path, monkeypatch):
    from rlx.trainer.tracking import wandb_has_credentials

    for k in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    assert not wandb_has_credentials()  # no file
    netrc.write_text("machine example.com\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    assert not wandb_has_credentials()  # another host
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {KEY}\n")
    assert wandb_has_credentials()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.mycompany.com")  # a private server: its own entry
    assert not wandb_has_credentials()
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    assert wandb_has_credentials()


ONLINE_CHILD = """
import sys
from rlx.config import load_config
from rlx.trainer.tracking import init_wandb
cfg = load_config(["trainer.logger=[console,wandb]", "trainer.default_local_dir=" + sys.argv[1]],
                  config_name="quickstart")
print("starting", flush=True)
init_wandb(cfg, sys.argv[1])
"""


def test_validation_accepts_verls_default_loggers():
    cfg = load_config(['trainer.logger=["console","wandb"]'])
    assert cfg.trainer.logger == ["console", "wandb"]
