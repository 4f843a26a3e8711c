"""Disk space of checkpoints: how large one save of this job is (`estimate`), and the one line a save that ran out of
space ends with (`DiskFullError`, from `disk_full`).

The estimate counts what `save_engine` writes per role, from the model built on the meta device (no weights read):
`model` (the parameters in the master dtype, `fsdp_config.model_dtype`; with LoRA only the adapters, fp32),
`optimizer` (AdamW's two moments per trainable parameter, same dtype), `hf_model` (the full, LoRA-merged model in
the master dtype), `lora_adapter` (the adapters, fp32); `extra` (RNG and scheduler states) is a few KB.
"""
from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field

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


class DiskFullError(RuntimeError):
    """A save that ran out of disk space; the message is the run's last line (with the checkpoint note)."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` (a worker's error as Ray hands it back included) comes from a full disk: an OSError ENOSPC or
    EDQUOT anywhere in its chain of causes, or torch's zip writer's message for it (which drops the errno)."""
    seen = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return False


def disk_full(exc: BaseException, folder: str, needed: int, what: str) -> DiskFullError | None:
    """The `DiskFullError` for a save of `what` into `folder` that failed with `exc`, or None when `exc` is not a full
    disk (nor a failed write with no space left: less free than `needed`)."""
    free = free_bytes(folder)
    if not (is_disk_full(exc) or ("write" in str(exc).lower() and free < needed)):
        return None
    return DiskFullError(f"disk full while saving {what} to {folder}: it needs about {human(needed)}, "
                         f"{human(free)} are free on that disk. Fix: free space there or set "
                         f"trainer.default_local_dir to a larger disk, then run the same command again.")
