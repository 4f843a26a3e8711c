"""How every part of a checkpoint is written: whole or not at all (`atomic_write`), and by the ranks of a
collective save in step (`rank_world`, `barrier`)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def atomic_write(path: str, data) -> None:
    """Write `data` (str, or any object for torch.save) to a temp file, fsync, then rename over `path`."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w" if isinstance(data, str) else "wb") as f:
        f.write(data) if isinstance(data, str) else torch.save(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
