"""What ends a run: a reward that is not a finite number, optimizer steps skipped again and again, SIGTERM."""
import math

import pytest

from rlx.trainer.stopping import SkippedStepGuard, TrainingStopped


def test_skipped_steps_are_counted_and_stop_the_run(caplog):
    guard = SkippedStepGuard(limit=3)
    ok, bad = {"actor/grad_norm": 0.5}, {"actor/grad_norm": math.nan, "critic/grad_norm": 1.0}
    with caplog.at_level("WARNING", logger="rlx"):
        for step, m in enumerate([dict(bad), dict(bad), dict(ok), dict(bad), dict(bad)], start=1):
            guard.count(m, step)
            guard.stop_if_stuck(step)
            assert m["actor/skipped_steps"] == (0.0 if m["actor/grad_norm"] == 0.5 else 1.0)
            assert m["critic/skipped_steps"] == 0.0 if "critic/grad_norm" in m else "critic/skipped_steps" not in m
        assert "step 5: optimizer step skipped" in caplog.text and "2 consecutive" in caplog.text
        guard.count(dict(bad), 6)
        with pytest.raises(TrainingStopped, match="3 consecutive steps.*max_consecutive_skipped_steps"):
            guard.stop_if_stuck(6)
    # the engine's own count wins over the one derived from the norm; critic skips count too
    m = {"actor/grad_norm": 0.3, "critic/grad_norm": math.inf, "critic/skipped_steps": 2.0}
    SkippedStepGuard(limit=0).count(m, 1)
    assert m["actor/skipped_steps"] == 0.0 and m["critic/skipped_steps"] == 2.0
    never = SkippedStepGuard(limit=0)
    for step in range(10):
        never.count({"actor/grad_norm": math.nan}, step)
        never.stop_if_stuck(step)  # 0: never stops


_SIGTERM_AT = r'''
import os, signal, sys, time
from rlx.trainer import launch, main_ppo, phases, ppo_trainer, preflight

where = sys.argv[1]


def sigterm():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler interrupts the sleep (or, while deferred, lets it finish)


if where == "preflight":
    preflight.preflight = lambda cfg, plan=None: sigterm()
else:
    preflight.preflight = lambda cfg, plan=None: preflight.DriverInputs(None, None, None, None, None)


def init_ray(cfg, plan):
    if where == "ray_init":
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # what ray.init installs
        sigterm()


class Trainer:  # stands in for the workers: the signal's timing is what is tested
    def __init__(self, *args):
        self.global_step, self.val_history = 3, []
        self.launch = phases.LaunchTiming()  # launch.run records ray.init's time in it

    def fit(self):
        if where == "c_code":  # the handler's exception met C code: it surfaces as a SystemError (issue 39)
            try:
                sigterm()
            except launch.Terminated:
                raise SystemError("<built-in method> returned a result with an exception set") from None
        return []

    def shutdown(self):
        if where == "cleanup":
            sigterm()
            print("cleanup finished", file=sys.stderr)


launch.init_ray = init_ray
ppo_trainer.RayPPOTrainer = Trainer
sys.exit(main_ppo.main(sys.argv[2:]))
'''
