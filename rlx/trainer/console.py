"""The console of a run: one line per step, the validation lines, rlx's own messages and the warnings that matter.

- Workers' output (vLLM's engine logs, FSDP and HF warnings, progress bars) is not streamed to the driver's
  console: it stays in Ray's log folder (`<ray temp dir>/session_*/logs/worker-*.{out,err}` on each node, where
  verl users look for it), whose path is printed when Ray is up. `RAY_LOG_TO_DRIVER=1` streams it as before.
- Known harmless warnings are dropped where they are logged (a filter on that exact record), never by grepping
  output: Ray's note that token authentication is on for the local cluster it starts (the secure default;
  its opposite, auth being off, still warns); vLLM's rotary-cache note on every weight sync is handled by the
  vLLM rollout itself (`rlx.workers.rollout.vllm_rollout`).
"""
from __future__ import annotations

import logging
import os
import sys


def keep_worker_output_in_ray_logs() -> None:
    """Call before Ray is imported: Ray reads RAY_LOG_TO_DRIVER once, at import (a user's own value wins)."""
    os.environ.setdefault("RAY_LOG_TO_DRIVER", "0")


class _TokenAuthEnabledNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Token authentication is enabled for this Ray cluster.")


def drop_known_harmless_warnings() -> None:
    target = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _TokenAuthEnabledNote) for f in target.filters):
        target.addFilter(_TokenAuthEnabledNote())


def announce_worker_logs() -> None:
    """Once Ray is up: where the workers' output goes (unless it is streamed here)."""
    import ray._private.worker as ray_worker
    from ray._private import ray_constants

    if ray_constants.RAY_LOG_TO_DRIVER:
        return
    try:
        node = ray_worker.global_worker.node
        if node is None:  # not connected: no logs dir to ask for
            raise AttributeError("no Ray node")
        logs = node.get_logs_dir_path()
    except AttributeError:  # a Ray without this (private) accessor: the usual place
        logs = "<ray temp dir>/session_latest/logs"
    print(f"rlx: worker output (vLLM, FSDP, Ray) goes to {logs}/worker-*.out|err (on each node of a cluster); "
          f"RAY_LOG_TO_DRIVER=1 shows it here", file=sys.stderr, flush=True)


def validation_summary(val_history: list[dict], validated_before_training: bool) -> list[str]:
    """The lines printed when a run ends, one per `val/<data_source>/reward/mean`: `start X -> end Y` when a
    validation ran before training (trainer.val_before_train or val_only), else the last value alone (a "start"
    would be a value measured after training)."""
    if not val_history:
        return []
    first, last = val_history[0], val_history[-1]
    keys = sorted(k for k in last if k.endswith("/reward/mean"))
    if not validated_before_training:
        return [f"validation {k}: end {last[k]:.4f} (no validation before training: trainer.val_before_train=False)"
                for k in keys]
    if len(val_history) == 1:
        return [f"validation {k}: {last[k]:.4f}" for k in keys]
    return [f"validation {k}: start {first[k]:.4f} -> end {last[k]:.4f}" if k in first else
            f"validation {k}: end {last[k]:.4f}" for k in keys]
