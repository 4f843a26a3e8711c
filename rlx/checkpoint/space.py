"""Disk space of checkpoints: how large one save of this job is (`estimate`), and the one line a save that the disk
refused ends with (`save_error`: `DiskFullError` for a full disk, `CheckpointSaveError` for a read-only disk or
another OSError).

The estimate counts what `save_engine` writes per role, from the model built on the meta device (no weights read):
`model` (the parameters in the master dtype, `fsdp_config.model_dtype`; with LoRA only the adapters, fp32),
`optimizer` (AdamW's two moments per trainable parameter, same dtype), `hf_model` (the full, LoRA-merged model in
the master dtype), `lora_adapter` (the adapters, fp32); `extra` (RNG and scheduler states) is a few KB.
"""
from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from rlx.checkpoint.errors import CheckpointSaveError

_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass
class CheckpointSize:
    total: int = 0
    parts: dict[str, int] = field(default_factory=dict)
    """"<role> <content>": bytes."""

    def describe(self) -> str:
        return ", ".join(f"{name} {human(n)}" for name, n in self.parts.items())


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def role_bytes(total_params: int, trainable: int, lora: bool, dtype_bytes: int, contents) -> dict[str, int]:
    """Bytes per saved content of one role."""
    out = {}
    if "model" in contents:
        out["model"] = trainable * 4 if lora else total_params * dtype_bytes
    if "optimizer" in contents:
        out["optimizer"] = 2 * trainable * (4 if lora else dtype_bytes)
    if "hf_model" in contents:
        out["hf_model"] = total_params * dtype_bytes
    if "lora_adapter" in contents and lora:
        out["lora_adapter"] = trainable * 4
    return out


def estimate(cfg, plan) -> CheckpointSize:
    """One checkpoint of this job (`cfg`: RLXConfig, `plan`: its JobPlan): actor, and critic when it trains one."""
    from rlx.engine.architecture import build_meta

    a = cfg.actor_rollout_ref
    roles = [("actor", a.model, a.actor.fsdp_config.model_dtype, a.actor.checkpoint.save_contents)]
    if plan.roles.critic:
        roles.append(("critic", cfg.critic.model, cfg.critic.model.fsdp_config.model_dtype,
                      cfg.critic.checkpoint.save_contents))
    size = CheckpointSize()
    for role, model_cfg, dtype, contents in roles:
        model, lora = build_meta(model_cfg, role)
        total = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if lora is not None else total
        for content, n in role_bytes(total, trainable, lora is not None, _DTYPE_BYTES.get(dtype, 4),
                                     contents).items():
            size.parts[f"{role} {content}"] = n
            size.total += n
    return size


def nearest_existing(path: str) -> str:
    """`path` or its nearest existing ancestor (what a folder not made yet will be on)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def free_bytes(path: str) -> int:
    return shutil.disk_usage(nearest_existing(path)).free


class DiskFullError(CheckpointSaveError):
    """A save that ran out of disk space (`ENOSPC`, `EDQUOT`)."""


def _chain(exc: BaseException):
    """`exc` and every error behind it: its causes and contexts, a Ray task error's `cause` (a worker's error), and
    each rank's error of a torch.distributed.checkpoint `CheckpointException` (`failures`: rank -> (error, trace))."""
    seen: set[int] = set()
    todo: list = [exc]
    while todo:
        e = todo.pop(0)
        if isinstance(e, tuple):  # a CheckpointException's (error, trace)
            e = e[0] if e else None
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        failures = getattr(e, "failures", None)
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__,
                 *(failures.values() if isinstance(failures, dict) else ())]


def os_error(exc: BaseException) -> OSError | None:
    """The first OSError with an errno behind `exc` (a Ray task error's own OSError face has none)."""
    return next((e for e in _chain(exc) if isinstance(e, OSError) and e.errno is not None), None)


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` (a worker's error as Ray hands it back included) comes from a full disk: an OSError ENOSPC or
    EDQUOT anywhere behind it, or torch's zip writer's message for it (which drops the errno)."""
    return any((isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT))
               or "No space left on device" in str(e) or "Disk quota exceeded" in str(e) for e in _chain(exc))


def save_error(exc: BaseException, folder: str, step: int,
               needed: Callable[[], int]) -> CheckpointSaveError | None:
    """The one-line error of the save of `step` into `folder` that failed with `exc`, or None when `exc` is no disk
    fault (a bug: its own traceback says more). `needed()`: the bytes a checkpoint takes, for a full disk."""
    where = f"while saving the checkpoint of step {step} to {folder}"
    again = "then run the same command again"
    full, err, free = is_disk_full(exc), os_error(exc), free_bytes(folder)
    # a failed write with less free than a checkpoint takes is a full disk too: torch's zip writer drops the errno
    write_failed = any("write" in str(e).lower() for e in _chain(exc))
    need = needed() if full or (err is None and write_failed) else 0
    if full or free < need:
        return DiskFullError(f"disk full {where}: it needs about {human(need)}, {human(free)} are free on that "
                             f"disk. Fix: free space there, {again} (or move trainer.default_local_dir, with its "
                             f"checkpoints, to a larger disk).")
    if (err is not None and err.errno == errno.EROFS) or any("Read-only file system" in str(e) for e in _chain(exc)):
        return CheckpointSaveError(f"read-only file system {where}: nothing can be written there. Fix: make that "
                                   f"disk writable (remount it read-write), {again} (or move "
                                   f"trainer.default_local_dir, with its checkpoints, to a writable disk).")
    if err is None:
        return None
    name = errno.errorcode.get(err.errno or 0, f"errno {err.errno}")
    at = ""
    if err.filename:
        rel = os.path.relpath(os.fsdecode(err.filename), folder)
        at = f" (at {rel if not rel.startswith('..') else os.fsdecode(err.filename)})"
    return CheckpointSaveError(f"{err.strerror or err} ({name}) {where}{at}. Fix: check that disk (its mount, "
                               f"permissions and the system log: dmesg), {again} (or move trainer.default_local_dir, "
                               f"with its checkpoints, to another disk).")
