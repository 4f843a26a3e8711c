"""When a run stops itself: `TrainingStopped`, and the guard that stops it once optimizer steps keep being skipped."""
from __future__ import annotations

import logging
import math

log = logging.getLogger("rlx")


class TrainingStopped(RuntimeError):
    """The run cannot usefully go on (a reward that is not a finite number, optimizer steps skipped again and
    again): the entry point reports it in one block and exits non-zero."""


class SkippedStepGuard:
    """Counts optimizer steps skipped for a non-finite gradient norm (`{role}/skipped_steps`, from the engine, or
    derived from a non-finite `{role}/grad_norm`), warns on the driver, and stops the run after `limit`
    consecutive training steps with a skip (`trainer.max_consecutive_skipped_steps`; 0: never)."""

    ROLES = ("actor", "critic")

    def __init__(self, limit: int):
        self.limit, self.consecutive, self.last = limit, 0, ""

    def count(self, metrics: dict, step: int) -> None:
        """Add `{role}/skipped_steps` to a step's metrics; warn when the step skipped an optimizer step."""
        skipped = {}
        for role in self.ROLES:
            norm = metrics.get(f"{role}/grad_norm")
            if norm is None:
                continue  # no update of that role this step (no critic, critic warmup)
            count = metrics.setdefault(f"{role}/skipped_steps", 0.0 if math.isfinite(norm) else 1.0)
            if count:
                skipped[role] = f"{role}/grad_norm={norm}, {role}/skipped_steps={count:g}"
        self.last = "; ".join(skipped.values())
        if not skipped:
            self.consecutive = 0
            return
        self.consecutive += 1
        log.warning("step %d: optimizer step skipped for a non-finite gradient norm (%s); %d consecutive step(s) "
                    "with a skip (the run stops after %s)", step, self.last, self.consecutive,
                    self.limit or "never (trainer.max_consecutive_skipped_steps=0)")

    def stop_if_stuck(self, step: int) -> None:
        """After the step is logged: `TrainingStopped` once `limit` steps in a row skipped."""
        if self.limit and self.consecutive >= self.limit:
            raise TrainingStopped(
                f"step {step}: the optimizer step was skipped for a non-finite gradient norm in {self.consecutive} "
                f"consecutive steps ({self.last}), so the model is no longer training. Usual "
                f"causes: a learning rate too high for the model (actor_rollout_ref.actor.optim.lr, critic.optim.lr),"
                f" or an overflow in low precision. To tolerate more, raise trainer.max_consecutive_skipped_steps "
                f"(0: never stop).")
