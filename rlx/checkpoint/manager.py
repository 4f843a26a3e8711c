"""The driver's checkpoints, one call each: `CheckpointManager.save(step, ...)` after a step, `resume(...)` before
the first.

A save writes every part first (each worker group saves its engines under the step's folder of its name), then the
driver's state, then the COMPLETE manifest, then the latest pointer, and only then rotates old steps away: a crash
at any point never leaves a pointer to a partial checkpoint nor removes the last complete one. A save that the disk
refuses (full, read-only, another OSError) removes its partial folder and raises one `CheckpointSaveError`. The step
to resume from is chosen and verified before any worker starts (`store.find_resume_dir`, `store.check_resume_files`,
run by the preflight); `resume` loads it.
"""
from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import Protocol

from rlx.checkpoint.store import (is_complete, list_steps, load_driver_state, mark_complete, rotate,
                                  save_driver_state, step_dir, write_latest)
from rlx.config.schema import TrainerConfig

log = logging.getLogger("rlx")

ROTATED = ("actor", "critic")  # the parts whose old steps `trainer.max_{part}_ckpt_to_keep` bounds


class Part(Protocol):
    """What a checkpoint holds besides the driver's state: a worker group that saves and loads its engines (every
    rank) under a folder."""

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...


class CheckpointManager:
    """The checkpoints of one run under `trainer.default_local_dir` (the root)."""

    def __init__(self, trainer_cfg: TrainerConfig, estimate: Callable[[], int] = lambda: 0):
        self.root = os.path.abspath(trainer_cfg.default_local_dir)
        self.keep = {"actor": trainer_cfg.max_actor_ckpt_to_keep, "critic": trainer_cfg.max_critic_ckpt_to_keep}
        self.estimate = estimate  # one checkpoint's bytes before any is saved, for a full disk's line

    def save(self, step: int, parts: dict[str, Part], driver_state: dict) -> str:
        """Save `step`: each part under its name, `driver_state` (JSON: numbers, strings, tensors, arrays), the
        manifest, the latest pointer; then rotate. Returns the step's folder. A save the disk refuses raises
        `CheckpointSaveError` (after removing what it wrote, unless the step was already complete)."""
        from rlx.checkpoint.space import save_error

        d = step_dir(self.root, step)
        try:
            return self._save(d, step, parts, driver_state)
        except Exception as e:
            if not is_complete(d):  # the steps before stay as they were; this one's partial files go
                shutil.rmtree(d, ignore_errors=True)
            failed = save_error(e, d, step, self.checkpoint_bytes)
            if failed is None:
                raise
            log.debug("the save of step %d failed: %r", step, e)
            raise failed from e

    def checkpoint_bytes(self) -> int:
        """One checkpoint's bytes: the last complete one's on disk, else the estimate."""
        steps = list_steps(self.root)
        if not steps:
            return self.estimate()
        last = step_dir(self.root, steps[-1])
        return sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(last) for f in fs)

    def _save(self, d: str, step: int, parts: dict[str, Part], driver_state: dict) -> str:
        for name, part in parts.items():
            part.save(os.path.join(d, name))
        save_driver_state(d, driver_state)
        mark_complete(d)
        write_latest(self.root, step)
        for name in ROTATED:
            rotate(self.root, self.keep[name], name)
        log.info("saved checkpoint %s", d)
        return d

    def resume(self, directory: str | None, parts: dict[str, Part]) -> dict | None:
        """Load each part from the verified step folder `directory` (preflight's choice; None: a fresh start) and
        return the driver's state saved with it, or None when there is nothing to resume."""
        if directory is None:
            return None
        state = load_driver_state(directory)
        for name, part in parts.items():
            part.load(os.path.join(directory, name))
        log.info("resumed from %s at step %s", directory, state.get("global_step"))
        return state
