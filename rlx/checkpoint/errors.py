"""The ways a checkpoint or its folder is refused, shared by the store, the safe loaders and the lock."""
from __future__ import annotations


class UnsafeCheckpointError(ValueError):
    """A checkpoint file that would only load by running code from it (a pickled object); rlx refuses it."""


class DamagedCheckpointError(ValueError):
    """No checkpoint to resume from could be verified, and starting fresh would be wrong."""


class CheckpointDirLocked(ValueError):
    """Another run holds the checkpoint folder (exit 2: nothing was started)."""


class CheckpointSaveError(RuntimeError):
    """A save that the disk refused (full, read-only, another OSError): the message names the step, the folder, the
    cause and the fix, and is the run's last line (with the last complete checkpoint, which stays whole)."""
