"""The checkpoint store, rank-agnostic (the driver's side; no Ray): step folders, their manifests and verification,
the latest pointer, rotation, the driver's own state, and the choice of the step to resume from.

Layout under the root (`trainer.default_local_dir`)::

    global_step_N/actor/{model/, optim/, extra_rank{r}.pt, meta.json, huggingface/}   (`rlx.checkpoint.engine_state`)
    global_step_N/critic/...
    global_step_N/driver_state.json
    global_step_N/COMPLETE                      written last, by the driver: the step is resumable; holds
                                                the size and sha256 of every other file of the step
    latest_checkpointed_iteration.txt           verl's pointer, written after COMPLETE

Integrity: resume only starts from a step whose files all match the checksums in its COMPLETE marker
(`verify`); a step that does not (bytes overwritten, a truncated or unreadable file, a marker without
checksums) is reported by file and skipped for the newest earlier one that does, or stops the run
(`trainer.on_damaged_checkpoint`). Before any worker starts, every file of that step is read as resume reads it
(`check_resume_files`: nothing in them runs, `rlx.checkpoint.safety`). docs/faults.md has the whole story.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil

import numpy as np
import torch

from rlx.checkpoint.errors import DamagedCheckpointError
from rlx.checkpoint.files import atomic_write
from rlx.config.schema import TrainerConfig

log = logging.getLogger("rlx")

COMPLETE = "COMPLETE"
LATEST = "latest_checkpointed_iteration.txt"
DRIVER_STATE = "driver_state.json"
_STEP_RE = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{int(step)}")


def write_latest(root: str, step: int) -> None:
    """Point verl's `latest_checkpointed_iteration.txt` at `step` (after the step's COMPLETE marker)."""
    os.makedirs(root, exist_ok=True)
    atomic_write(os.path.join(root, LATEST), str(int(step)))


MANIFEST_FORMAT = "rlx-checkpoint-manifest/1"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)  # hashlib drops the GIL on large buffers: the thread pool hashes files in parallel
    return h.hexdigest()


def _files(directory: str) -> list[str]:
    """Every file of a step dir (relative paths), the marker itself and temp files of atomic writes excluded."""
    out = []
    for dirpath, _, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), directory)
            if rel != COMPLETE and ".tmp." not in name:
                out.append(rel)
    return sorted(out)


def _hash_all(directory: str, rels: list[str]) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = pool.map(lambda rel: _sha256(os.path.join(directory, rel)), rels)
        return dict(zip(rels, digests))


def mark_complete(directory: str) -> None:
    """Declare a step's checkpoint resumable: call last, after every engine part and the driver state.

    The marker records the size and sha256 of every file of the step, so that resume can tell a damaged
    checkpoint from a good one (`verify`)."""
    rels = _files(directory)
    digests = _hash_all(directory, rels)
    files = {rel: {"size": os.path.getsize(os.path.join(directory, rel)), "sha256": digests[rel]} for rel in rels}
    atomic_write(os.path.join(directory, COMPLETE), json.dumps({"format": MANIFEST_FORMAT, "files": files},
                                                                indent=1))


def is_complete(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, COMPLETE))


def verify(directory: str) -> list[str]:
    """Check a complete step against its COMPLETE manifest; returns the problems (file and what is wrong), or [].

    Sizes are checked first (a truncated file costs no hashing), then every checksum."""
    try:
        with open(os.path.join(directory, COMPLETE)) as f:
            manifest = json.load(f)
        files = manifest["files"] if manifest.get("format") == MANIFEST_FORMAT else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        files = None
    if not isinstance(files, dict):
        return [f"{COMPLETE}: holds no checksums (a marker from an older rlx, or damaged), so the checkpoint "
                f"cannot be verified"]
    problems, to_hash = [], []
    for rel, entry in sorted(files.items()):
        path = os.path.join(directory, rel)
        try:
            size = os.path.getsize(path)
        except OSError as e:
            problems.append(f"{rel}: missing or unreadable ({e.strerror or e})")
            continue
        if size != entry["size"]:
            problems.append(f"{rel}: {size} bytes, {entry['size']} when saved (truncated or rewritten)")
        else:
            to_hash.append(rel)
    try:
        digests = _hash_all(directory, to_hash)
    except OSError as e:
        return problems + [f"{os.path.relpath(e.filename, directory) if e.filename else '?'}: unreadable "
                           f"({e.strerror or e})"]
    problems += [f"{rel}: contents differ from the checksum recorded when it was saved (overwritten or corrupted)"
                 for rel in to_hash if digests[rel] != files[rel]["sha256"]]
    return problems


def list_steps(root: str, complete_only: bool = True) -> list[int]:
    """Steps with a `global_step_N` dir under `root` (only complete ones by default), ascending."""
    if not os.path.isdir(root):
        return []
    steps = [int(m.group(1)) for m in map(_STEP_RE.match, os.listdir(root)) if m]
    return sorted(s for s in steps if not complete_only or is_complete(step_dir(root, s)))


def _damage_report(directory: str, problems: list[str]) -> str:
    shown = problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
    return f"checkpoint {directory} is damaged:\n    " + "\n    ".join(shown)


def find_resume_dir(trainer_cfg: TrainerConfig) -> str | None:
    """The verified step dir to resume from per `trainer.resume_mode`, or None to start fresh.

    auto: the newest complete step under `trainer.default_local_dir` whose files match their checksums (the
    latest pointer is only trusted as far as it names such a dir; incomplete dirs from crashed saves are
    skipped, each named in one warning line). A damaged step is reported by file; with `trainer.on_damaged_checkpoint=previous` the newest
    earlier one that verifies is taken, with `error` (or when none verifies) a `DamagedCheckpointError` stops
    the run. disable: None. resume_path: `trainer.resume_from_path`, a complete step dir that verifies.
    """
    mode = trainer_cfg.resume_mode
    if mode == "disable":
        return None
    if mode == "auto":
        root = trainer_cfg.default_local_dir
        for step in sorted(set(list_steps(root, complete_only=False)) - set(list_steps(root))):
            log.warning("rlx: step %d is incomplete: skipped (%s has no %s marker: its save did not finish)", step,
                        step_dir(root, step), COMPLETE)
        damaged: list[str] = []
        for step in reversed(list_steps(root)):
            d = step_dir(root, step)
            problems = verify(d)
            if not problems:
                if damaged:
                    log.warning("%s\n  resuming from the previous complete checkpoint %s instead "
                                "(trainer.on_damaged_checkpoint=previous)", "\n".join(damaged), d)
                return d
            damaged.append(_damage_report(d, problems))
            if trainer_cfg.on_damaged_checkpoint == "error":
                raise DamagedCheckpointError(
                    f"{damaged[-1]}\n  Fix: restore it, or resume from an earlier step with "
                    f"trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N dir>, or set "
                    f"trainer.on_damaged_checkpoint=previous")
        if damaged:
            raise DamagedCheckpointError(
                "\n".join(damaged) + f"\n  No checkpoint under {root} verifies, so there is nothing to resume "
                f"from. Fix: restore one, or start fresh with trainer.resume_mode=disable (or another "
                f"trainer.default_local_dir)")
        return None
    if mode == "resume_path":
        path = trainer_cfg.resume_from_path
        if not path or not os.path.isdir(path):
            raise ValueError(f"trainer.resume_from_path={path!r} does not exist (trainer.resume_mode=resume_path); "
                             f"give a global_step_N checkpoint dir or set trainer.resume_mode=auto")
        if not is_complete(path):
            raise ValueError(f"trainer.resume_from_path={path!r} is not a complete checkpoint (no {COMPLETE} "
                             f"marker: its save did not finish); give a global_step_N dir that has one")
        problems = verify(path)
        if problems:
            raise DamagedCheckpointError(f"trainer.resume_from_path: {_damage_report(path, problems)}\n  Fix: "
                                         f"give an earlier global_step_N dir, or trainer.resume_mode=auto")
        return path
    raise ValueError(f"trainer.resume_mode={mode!r}: choose auto | disable | resume_path")


def _json_dtype(name, numpy: bool):
    """A dtype named in the driver state: a torch or numpy number type, nothing else (an object dtype or any other
    attribute of torch is refused as damage)."""
    if numpy:
        dtype = np.dtype(name) if isinstance(name, str) else None
        if dtype is None or dtype.kind not in "biufc":
            raise ValueError(f"dtype {name!r} is not a numpy number type")
        return dtype
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype")
    return dtype


_JSON_TAGS = {"__tensor__": lambda v, d: torch.tensor(v, dtype=_json_dtype(d, numpy=False)),
              "__ndarray__": lambda v, d: np.asarray(v, dtype=_json_dtype(d, numpy=True))}


def _to_json(x):
    if isinstance(x, (torch.Tensor, np.ndarray)):
        tag = "__tensor__" if isinstance(x, torch.Tensor) else "__ndarray__"
        return {tag: x.tolist(), "dtype": str(x.dtype).replace("torch.", "")}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (tuple, list)):
        items = [_to_json(v) for v in x]
        return {"__tuple__": items} if isinstance(x, tuple) else items
    if isinstance(x, dict):
        return {str(k): _to_json(v) for k, v in x.items()}
    return x


def _from_json(x):
    if isinstance(x, list):
        return [_from_json(v) for v in x]
    if not isinstance(x, dict):
        return x
    for tag, build in _JSON_TAGS.items():
        if tag in x:
            return build(x[tag], x["dtype"])
    if "__tuple__" in x:
        return tuple(_from_json(v) for v in x["__tuple__"])
    return {k: _from_json(v) for k, v in x.items()}


def save_driver_state(directory: str, state: dict) -> None:
    """JSON (atomic) of the driver's state: global_step, dataloader state, kl controller value, ...
    Tensors, numpy arrays and tuples survive the round trip."""
    os.makedirs(directory, exist_ok=True)
    atomic_write(os.path.join(directory, DRIVER_STATE), json.dumps(_to_json(state), indent=1))


def load_driver_state(directory: str) -> dict:
    path = os.path.join(directory, DRIVER_STATE)
    try:
        with open(path) as f:
            return _from_json(json.load(f))
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise DamagedCheckpointError(f"{path} is unreadable ({type(e).__name__}: {e}); resume from the previous "
                                     f"step: trainer.resume_mode=resume_path trainer.resume_from_path=<an "
                                     f"earlier global_step_N dir>") from None


def rotate(root: str, keep: int | None, subdir: str) -> list[str]:
    """Keep `subdir` (actor | critic) of the newest `keep` steps that have it; remove it from older steps.

    A step that loses a part is no longer resumable: its COMPLETE marker goes first, and the whole step dir
    once neither actor nor critic is left. Incomplete steps newer than the newest complete one are left
    alone. keep None or <= 0: keep everything. Returns the removed paths.
    """
    if subdir not in ("actor", "critic"):
        raise ValueError(f"rotate: subdir={subdir!r}, expected actor | critic")
    if not keep or keep <= 0:
        return []
    complete = list_steps(root)
    if not complete:
        return []
    having = [s for s in list_steps(root, complete_only=False)
              if s <= complete[-1] and os.path.isdir(os.path.join(step_dir(root, s), subdir))]
    if len(having) <= keep:
        return []
    cutoff = having[-keep]
    removed = []
    for step in list_steps(root, complete_only=False):
        d = step_dir(root, step)
        if step >= cutoff or not os.path.isdir(os.path.join(d, subdir)):
            continue
        if is_complete(d):
            os.remove(os.path.join(d, COMPLETE))
        shutil.rmtree(os.path.join(d, subdir))
        removed.append(os.path.join(d, subdir))
        if not any(os.path.isdir(os.path.join(d, s)) for s in ("actor", "critic")):
            shutil.rmtree(d)
    return removed


def check_resume_files(step: str) -> list[str]:
    """The problems of every file of a step dir that resume reads, each read as resume reads it (nothing in them
    runs); [] when all load. The driver calls this before any worker starts."""
    from rlx.checkpoint.safety import check_dcp_dir, check_extra_files, check_meta_json

    problems = []
    try:
        load_driver_state(step)
    except ValueError as e:
        problems.append(str(e))
    for role in sorted(os.listdir(step)):
        role_dir = os.path.join(step, role)
        if not os.path.isdir(role_dir):
            continue
        if os.path.exists(os.path.join(role_dir, "meta.json")):
            problems += check_meta_json(os.path.join(role_dir, "meta.json"))
        for part in ("model", "optim"):
            if os.path.isdir(os.path.join(role_dir, part)):
                problems += check_dcp_dir(os.path.join(role_dir, part))
    return problems + check_extra_files(step)
