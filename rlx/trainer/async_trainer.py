"""Rollout and training overlapped on separate GPUs (actor_rollout_ref.hybrid_engine=False).

The rollout pool generates while the trainer pool trains. Two threads of the driver share the work:

- the rollouter (`Rollouter`, a background thread) draws the prompts of batch j, generates them on the rollout
  workers and scores them, and queues the batch. It starts batch j only while the rollout's weights are recent
  enough: at most `staleness` policy versions behind the trainer's when batch j trains (`admits`).
- the trainer (the main thread: the colocated trainer's `fit` with this module's hooks) takes the batches in
  order and runs the colocated trainer's update on each (old log-probs, ref, values, advantages, updates); every
  `sync_every` steps it sends the weights to the rollout workers (`sync`), between two of their calls (`Gate`).

A policy version is the training step whose weights the rollout holds; a sample's lag is the number of syncs between
the version of its oldest token and the trainer's weights. With staleness 0 the two threads take turns and the run
is the colocated run's, loss for loss. With staleness 1 (one-step-off) batch k+1 is generated while batch k trains.
Without partial rollout a sync waits for the rollout call in flight to end; with it, for the segment in flight,
and every admitted batch starts at once: the rollout workers generate all open batches together, segment by
segment, so batch j+1 fills the engine while batch j's longest responses finish.
A sample that lags more than the bound is dropped, never trained on (`drop_stale`).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from rlx.plan import ROLLOUT_GROUP
from rlx.protocol import Batch
from rlx.trainer.ppo_trainer import RayPPOTrainer, timed
from rlx.trainer.stopping import TrainingStopped
from rlx.workers.rollout_worker import VERSIONS

if TYPE_CHECKING:
    from rlx.workers.rollout_worker import RolloutGroup

log = logging.getLogger("rlx")


def lag(trained_at: int, version, sync_every: int):
    """Syncs between the weights of training step `version` and those batch `trained_at` is trained with (the
    update of step trained_at starts from step trained_at - 1's weights)."""
    return (trained_at - 1) // sync_every - np.floor_divide(version, sync_every)


def oldest_versions(versions: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[rows]: the version of each response's oldest generated token (an empty response: its first slot's tag)."""
    big = torch.iinfo(torch.long).max
    oldest = torch.where(response_mask.bool(), versions, torch.full_like(versions, big)).min(dim=1).values
    return torch.where(oldest == big, versions[:, 0], oldest)


def stale_rows(versions: torch.Tensor, response_mask: torch.Tensor, trained_at: int, sync_every: int,
               bound: int) -> torch.Tensor:
    """Bool [rows]: rows whose oldest generated token lags more than `bound` versions at step `trained_at`."""
    return torch.as_tensor(lag(trained_at, oldest_versions(versions, response_mask).numpy(), sync_every) > bound)


def staleness_metrics(versions: torch.Tensor, response_mask: torch.Tensor, trained_at: int,
                      sync_every: int) -> dict:
    """async/staleness_{mean,max} (lag of each sample's oldest token), async/version_lag/<l> (share of the samples
    with lag l), async/partial_samples (samples whose tokens come from more than one version)."""
    mask = response_mask.bool()
    oldest = oldest_versions(versions, response_mask)
    newest = torch.where(mask, versions, torch.full_like(versions, -1)).max(dim=1).values
    lags = lag(trained_at, oldest.numpy(), sync_every)
    out = {"async/staleness_mean": float(np.mean(lags)), "async/staleness_max": float(np.max(lags)),
           "async/partial_samples": float(((newest > oldest) & mask.any(dim=1)).sum())}
    values, counts = np.unique(lags, return_counts=True)
    out.update({f"async/version_lag/{int(v)}": float(c) / len(lags) for v, c in zip(values, counts)})
    return out


class Gate:
    """Who uses the rollout workers now: the rollouter's calls, or a pause (a weight sync, a validation) that the
    trainer takes between two of them. The rollout's current version lives here too."""

    def __init__(self, version: int):
        self.cv = threading.Condition()
        self.busy, self.pausing, self.version = False, 0, version
        self.busy_s = 0.0  # seconds the rollout workers spent in rollouter calls

    @contextlib.contextmanager
    def rollout_call(self):
        with self.cv:
            self.cv.wait_for(lambda: self.pausing == 0)
            self.busy = True
        start = time.perf_counter()
        try:
            yield
        finally:
            with self.cv:
                self.busy = False
                self.busy_s += time.perf_counter() - start
                self.cv.notify_all()

    @contextlib.contextmanager
    def paused(self):
        with self.cv:
            self.pausing += 1
            self.cv.wait_for(lambda: not self.busy)
        try:
            yield
        finally:
            with self.cv:
                self.pausing -= 1
                self.cv.notify_all()

    def set_version(self, version: int) -> None:
        with self.cv:
            self.version = version
            self.cv.notify_all()

    def wait_until(self, predicate, stop: threading.Event) -> None:
        with self.cv:
            while not (predicate(self.version) or stop.is_set()):
                self.cv.wait(timeout=0.5)


@dataclass
class Rollout:
    """A generated, scored batch waiting for the trainer."""
    step: int
    batch: Batch
    metrics: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)
    loader_state: dict = field(default_factory=dict)


class Rollouter(threading.Thread):
    """Generates and scores batches first_step .. last_step in order, each admitted by the staleness bound.

    Without partial rollout one batch is generated at a time. With it every admitted batch starts generating at
    once, in a thread of its own (`Generation`), and the rollout workers advance all open batches together (the
    `SegmentPump`): batch j+1 fills the engine while batch j's longest responses finish. Batches are scored and
    queued in order, here."""

    def __init__(self, trainer: "AsyncPPOTrainer", first_step: int, last_step: int):
        super().__init__(name="rlx-rollouter", daemon=True)
        self.trainer, self.first, self.last = trainer, first_step, last_step
        self.out: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def admits(self, step: int, version: int) -> bool:
        """Batch `step` may start with weights `version`: its samples will lag at most the bound when trained."""
        a = self.trainer.plan.async_
        assert a is not None  # an async job's plan
        return lag(step, version, a.sync_every) <= a.staleness

    def run(self) -> None:
        try:
            assert self.trainer.plan.async_ is not None  # an async job's plan
            if self.trainer.plan.async_.partial_rollout:
                self.run_pipelined()
            else:
                self.run_one_at_a_time()
        except BaseException as e:  # noqa: BLE001 -- handed to the trainer thread, which raises it
            self.error = e
            self.out.put(None)

    def run_one_at_a_time(self) -> None:
        t = self.trainer
        for step in range(self.first, self.last + 1):
            t.gate.wait_until(lambda v: self.admits(step, v), self.stop)
            if self.stop.is_set():
                return
            metrics: dict[str, float] = {}
            timing: dict[str, float] = {}
            batch = t.sample(t.train_loader.next_batch(), metrics, timing, step=step)
            self.out.put(Rollout(step, batch, metrics, timing, t.train_loader.state_dict()))

    def run_pipelined(self) -> None:
        t = self.trainer
        open_: collections.deque[Generation] = collections.deque()
        step = self.first
        while (step <= self.last or open_) and not self.stop.is_set():
            while step <= self.last and self.admits(step, t.gate.version):  # start every admitted batch
                prompts = t.train_loader.next_batch()
                open_.append(Generation(step, prompts, t.train_loader.state_dict(), t))
                open_[-1].start()
                step += 1
            if not open_:
                t.gate.wait_until(lambda v: self.admits(step, v), self.stop)
                continue
            head = open_[0]
            head.join(timeout=0.05)
            if head.is_alive():
                continue
            open_.popleft()
            if head.error is not None:
                raise head.error
            timing: dict[str, float]
            metrics, timing = {"async/batches_in_flight": float(1 + len(open_))}, {}
            batch = t.sample(head.prompts, metrics, timing, step=head.step, generated=head.result)
            timing["gen"] = head.seconds + timing.get("gen", 0.0)  # its own generation (overlapping others')
            self.out.put(Rollout(head.step, batch, metrics, timing, head.loader_state))

    def next(self, step: int) -> Rollout:
        while True:
            try:
                item = self.out.get(timeout=1.0)
            except queue.Empty:
                if not self.is_alive() and self.out.empty():
                    raise RuntimeError("the rollouter thread ended without a batch") from self.error
                continue
            if item is None:
                assert self.error is not None  # run() puts None after setting it
                raise self.error
            assert item.step == step, (item.step, step)
            return item


class Generation(threading.Thread):
    """One batch's generation, started as soon as the staleness bound admits it (partial rollout)."""

    def __init__(self, step: int, prompts: Batch, loader_state: dict, trainer: "AsyncPPOTrainer"):
        super().__init__(name=f"rlx-generate-{step}", daemon=True)
        self.step, self.prompts, self.loader_state, self.trainer = step, prompts, loader_state, trainer
        self.result: Batch | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0

    def run(self) -> None:
        start = time.perf_counter()
        try:
            self.result = self.trainer.generate(self.prompts, validate=False, step=self.step)
        except BaseException as e:  # noqa: BLE001 -- raised by the rollouter
            self.error = e
        finally:
            self.seconds = time.perf_counter() - start


class AsyncPPOTrainer(RayPPOTrainer):
    """The PPO/GRPO loop with the rollout on GPUs of its own, overlapped with training (module docstring)."""

    def __init__(self, cfg, plan, inputs=None):
        super().__init__(cfg, plan, inputs)
        assert plan.async_ is not None and plan.rollout.disaggregated
        self.old_from_rollout = plan.async_.rollout_log_probs_as_old
        if plan.async_.default_is_correction:  # the lag is corrected by token-level truncated IS by default
            self.rollout_corr["rollout_is"] = "token"
        self.rollouts: RolloutGroup | None = None  # started by init_workers()
        self.rollouter: Rollouter | None = None  # the thread that generates ahead, while the steps run (stepping())
        self.gate = Gate(version=-1)
        self.trained_loader_state: dict | None = None

    # ---- setup ----------------------------------------------------------------------------------------
    def init_workers(self) -> None:
        import ray

        from rlx.workers.rollout_worker import RolloutGroup

        # the rollout's engines first: vLLM sizes its KV cache from free GPU memory
        with self.launch.phase("workers"):
            self.rollouts = RolloutGroup(self.place(ROLLOUT_GROUP), self.cfg, self.plan)
        with self.launch.phase("rollout_engine"):
            self.rollouts.init_model()
        assert self.plan.async_ is not None  # checked in __init__
        self.pump = self.rollouts.segment_pump(self.plan.async_.segment, self.gate.rollout_call)
        super().init_workers()  # the actor (and ref) and the critic on the trainer pool
        assert self.actor is not None
        dtype = self.cfg.actor_rollout_ref.rollout.dtype if self.plan.placement.device == "cuda" else "float32"
        self.weights_info = self.actor.weights_info(str(dtype).replace("torch.", ""), self.plan.async_.bucket_bytes)
        worlds = self.rollouts.transfer_groups  # one group per engine slot of the rollout GPUs
        host, ports = self.actor.transfer_addresses(len(worlds))
        ray.get(self.actor.open_weight_transfer(host, list(zip(ports, worlds)))
                + self.rollouts.open_weight_transfer(host, ports))

    def shutdown(self) -> None:
        if self.rollouts is not None:
            self.rollouts.shutdown()
            self.rollouts = None
        super().shutdown()

    # ---- the pieces the colocated loop calls ---------------------------------------------------------------
    def engine_generate(self, gen_in: Batch, validate: bool) -> Batch:
        a = self.plan.async_
        assert a is not None and self.rollouts is not None  # checked in __init__; init_workers ran
        if a.partial_rollout and not validate:
            return self.pump.generate(gen_in)
        if validate:  # the trainer thread, holding the rollout paused
            return self.rollouts.generate(gen_in)
        with self.gate.rollout_call():
            return self.rollouts.generate(gen_in)

    def loader_state(self) -> dict:
        return self.trained_loader_state if self.trained_loader_state is not None else super().loader_state()

    def sync(self, metrics: dict | None = None) -> None:
        """Send the trainer's weights (of step global_step) to the rollout workers, between two of their calls."""
        import ray

        from rlx.workers.group import reduce_metrics

        start = time.perf_counter()
        with self.gate.paused():
            waited = time.perf_counter() - start
            assert self.actor is not None and self.rollouts is not None  # init_workers ran
            sent = self.actor.send_weights(self.weights_info)
            got = self.rollouts.receive_weights(self.weights_info, self.global_step)
            stats = ray.get(sent)[0]
            received = reduce_metrics(ray.get(got))  # the rollout ranks' mean (their engines' work)
            self.gate.set_version(self.global_step)
        if metrics is not None:
            metrics.update({k: v for k, v in received.items() if k.startswith(("rollout/", "timing_s/rollout/"))})
            metrics["timing_s/wait_sync"] = waited
            metrics["timing_s/sync_weights"] = stats["seconds"]
            metrics["perf/sync_weights_gb"] = stats["bytes"] / 1e9

    # ---- the loop's hooks (RayPPOTrainer.fit) ----------------------------------------------------------
    def before_training(self) -> None:
        self.sync()  # the rollout starts from the trainer's weights (the resumed ones too)

    @contextlib.contextmanager
    def stepping(self):
        """The rollouter runs while the steps do."""
        self.rollouter = Rollouter(self, self.global_step + 1, self.total_steps)
        self.rollouter.start()
        try:
            yield
        finally:
            self.rollouter.stop.set()

    def next_step(self) -> dict:
        assert self.rollouter is not None  # inside stepping()
        return self.train_step_async(self.rollouter)

    def train_step_async(self, rollouter: Rollouter) -> dict:
        a = self.plan.async_
        assert a is not None  # checked in __init__
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        busy_before = self.gate.busy_s
        with timed("step", timing):
            with timed("wait_rollout", timing):
                item = rollouter.next(self.global_step)
            metrics.update(item.metrics)
            timing.update(item.timing)  # gen, reward: overlapped with training
            self.trained_loader_state = item.loader_state
            batch = self.drop_stale(item.batch, metrics)
            batch = self.update(batch, metrics, timing)
            if self.global_step % a.sync_every == 0:
                with timed("sync", timing):
                    self.sync(metrics)
        step_s = timing["step"]
        metrics["async/trainer_idle_ratio"] = (timing["wait_rollout"] + metrics.get("timing_s/wait_sync", 0.0)) / step_s
        metrics["async/rollout_idle_ratio"] = max(0.0, 1.0 - (self.gate.busy_s - busy_before) / step_s)
        metrics["async/rollout_version"] = float(self.gate.version)
        return self.step_metrics(batch, metrics, timing)

    def drop_stale(self, batch: Batch, metrics: dict) -> Batch:
        """The batch without the groups that hold a sample lagging more than the bound (counted in
        async/dropped_stale_samples); their staleness metrics."""
        a = self.plan.async_
        assert a is not None  # checked in __init__
        versions, mask = batch[VERSIONS], batch["response_mask"]
        metrics.update(staleness_metrics(versions, mask, self.global_step, a.sync_every))
        stale = stale_rows(versions, mask, self.global_step, a.sync_every, a.staleness)
        metrics["async/dropped_stale_samples"] = float(stale.sum())
        if not bool(stale.any()):
            return batch
        bad = {u for u, s in zip(batch["uid"], stale.tolist()) if s}
        keep = [i for i, u in enumerate(batch["uid"]) if u not in bad]
        if not keep:
            raise TrainingStopped(f"step {self.global_step}: every sample of the batch lags more than "
                                  f"async_training.staleness_threshold allows ({a.staleness} versions)")
        log.warning("step %d: %d sample(s) lag more than %d version(s) and are not trained on", self.global_step,
                    len(batch) - len(keep), a.staleness)
        return batch.index(keep)

    def validate(self) -> dict:
        """Validation on the rollout workers, with the trainer's current weights (synced first when the last sync
        is older), while the rollouter waits."""
        if self.gate.version != self.global_step:
            self.sync()
        with self.gate.paused():
            return super().validate()
