"""The two ways a checkpoint is refused, shared by the checkpoint store and its safe DCP reader."""
from __future__ import annotations


class UnsafeCheckpointError(ValueError):
    """A checkpoint file that would only load by running code from it (a pickled object); rlx refuses it."""


class DamagedCheckpointError(ValueError):
    """No checkpoint to resume from could be verified, and starting fresh would be wrong."""
