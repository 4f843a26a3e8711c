"""How a spawned CPU test rank ends (the gloo workers of the multi-rank tests).

Every such worker joins a gloo default group, runs its checks in `try`, and calls `end_rank()` in `finally`:

- its checks passed: every rank meets at a barrier (no rank closes its gloo connections while a peer's last
  collective is still in flight), the group is destroyed, and the process leaves at once with exit code 0. Skipping
  the interpreter's teardown matters: there, objects the finished checks still hold (FSDP modules referencing the
  group, gloo's work objects) are freed in no set order against gloo's threads, which aborted a passing rank in a
  full CI run ("terminate called without an active exception");
- a check failed: the group is destroyed (no barrier: the peer may be gone) and the exception goes on to the spawn
  wrapper, which fails the test with it.
"""
from __future__ import annotations

import os
import sys


def end_rank() -> None:
    """Call in the `finally` of a spawned rank's worker; see the module docstring."""
    import torch.distributed as dist

    passed = sys.exc_info()[0] is None
    if dist.is_initialized():
        if passed:
            dist.barrier()
        dist.destroy_process_group()
    if passed:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
