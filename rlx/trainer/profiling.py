"""Which training steps the workers profile (`global_profiler.steps`, `profile_continuous_steps`): the driver's side
of rlx.workers.profiling, entered once per step by the loop."""
from __future__ import annotations

import contextlib
import logging

from rlx.config.profiler import GlobalProfilerConfig

log = logging.getLogger("rlx")


class StepProfiling:
    """Starts the worker groups' profilers before a listed step and stops them after it (after its validation and
    checkpoint, as verl); with `profile_continuous_steps`, a run of consecutive listed steps is one window, cut at
    the run's last step."""

    def __init__(self, cfg: GlobalProfilerConfig, groups: list, last_step: int):
        self.steps = set(cfg.steps or [])
        self.continuous = cfg.profile_continuous_steps
        self.groups, self.last_step = [g for g in groups if g is not None], last_step
        self.traces: list[str] = []

    @contextlib.contextmanager
    def step(self, step: int):
        on = step in self.steps
        if on:  # a window begins, or (continuous) goes on
            for group in self.groups:
                group.start_profile(step)
        yield
        if on and (not self.continuous or step + 1 not in self.steps or step == self.last_step):
            written = [path for group in self.groups for path in group.stop_profile()]
            self.traces += written
            if written:
                log.info("step %d: profiler output in %s", step, ", ".join(written))
