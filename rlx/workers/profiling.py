"""The profiler of one worker process: verl's `global_profiler` and `<role>.profiler` keys, with torch's tools.

A worker process hosts one or more roles (the actor worker: actor, rollout, ref; the critic worker: critic). On the
steps of `global_profiler.steps` the driver calls `start(step)` before the step and `stop()` after it (after its
validation and checkpoint save, as verl); with `profile_continuous_steps` a run of consecutive listed steps is one
window. A role records on a rank when its `profiler.enable` is set and the rank is chosen (`all_ranks`, else
`ranks`, else rank 0), with its tool:

- torch: `torch.profiler` writes a chrome trace (`.json.gz`: open it in https://ui.perfetto.dev or
  chrome://tracing) to the role's `save_path`. By default one trace per worker process and window, holding
  everything the process ran in it, each phase a labelled range (`rollout_generate`, `actor_compute_log_prob`,
  `ref_compute_log_prob`, `actor_update`, `critic_compute_values`, `critic_update`); with `tool_config.torch.discrete`
  one trace per phase of the role.
- torch_memory (CUDA only): from the worker's start, CUDA's allocator history is recorded; after
  `memory_snapshot_num_steps` profiled steps a snapshot (`.pickle`, open it in https://pytorch.org/memory_viz) goes
  to `<save_path>/step<N>/`; an out-of-memory error on a chosen rank writes one to `<save_path>/oom_<time>/`.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
from typing import Union

import torch

from rlx.config.profiler import GlobalProfilerConfig, RoleProfilerConfig, RolloutProfilerConfig

log = logging.getLogger("rlx")

RoleConfig = Union[RoleProfilerConfig, RolloutProfilerConfig]


def rank_chosen(cfg: RoleConfig, rank: int) -> bool:
    """verl's choice of ranks: every rank with all_ranks, else those listed in ranks, else rank 0."""
    if cfg.all_ranks:
        return True
    return rank in cfg.ranks if cfg.ranks else rank == 0


def resolve_path(path: str) -> str:
    """A relative path is relative to the driver's working directory (RLX_DRIVER_CWD, set by the worker group)."""
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(os.environ.get("RLX_DRIVER_CWD", os.getcwd()), path)


def torch_profile(contents: set[str], cuda: bool) -> torch.profiler.profile:
    """A torch.profiler recording `contents` (tool_config.torch.contents): CPU operators always; GPU kernels on cuda
    unless the contents leave cuda out."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda and (not contents or "cuda" in contents):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes="shapes" in contents,
                                  profile_memory="memory" in contents, with_stack="stack" in contents)


class TorchMemory:
    """The torch_memory tool of one process: allocator history from now on; snapshots per profiled window and at
    out-of-memory."""

    def __init__(self, cfg: RoleConfig, global_cfg: GlobalProfilerConfig, rank: int, chosen: bool):
        shared = global_cfg.global_tool_config.torch_memory
        # the rollout's profiler has no torch_memory keys: the global ones, which a role's keys follow
        opts = cfg.tool_config.torch_memory if isinstance(cfg, RoleProfilerConfig) else shared
        self.rank, self.save_path, self.steps_per_snapshot = rank, cfg.save_path, opts.memory_snapshot_num_steps
        self.record_args = dict(context=shared.context, stacks=shared.stacks, max_entries=opts.trace_alloc_max_entries,
                                **shared.kw_args)
        self.window: list[int] = []
        torch.cuda.memory._record_memory_history(**self.record_args)
        if chosen:  # verl: the chosen ranks write a snapshot when an allocation fails
            # a private binding of CUDA builds, absent from torch's type stubs
            torch._C._cuda_attach_out_of_memory_observer(self._on_out_of_memory)  # type: ignore[attr-defined]

    def _dump(self, sub_dir: str, tag: str) -> str:
        assert self.save_path is not None  # validation (check_profiler) refuses a null save_path
        out = os.path.join(resolve_path(self.save_path), sub_dir)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"{tag}_rank{self.rank}_pid{os.getpid()}.pickle")
        torch.cuda.memory._dump_snapshot(path)
        return path

    def _on_out_of_memory(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        path = self._dump(f"oom_{time.strftime('%Y%m%d-%H%M%S')}", "torch_memory_oom")
        log.error("CUDA out of memory on device %d (asked %d bytes, %d free): allocator snapshot in %s", device, alloc,
                  device_free, path)

    def start(self, step: int) -> None:
        self.window.append(step)

    def stop(self) -> None:
        if len(self.window) < self.steps_per_snapshot:
            return
        first, last = self.window[0], self.window[-1]
        torch.cuda.synchronize()
        path = self._dump(f"step{first}" if first == last else f"steps{first}-{last}", "torch_memory")
        log.info("memory snapshot of steps %s written to %s", self.window, path)
        self.window = []
        torch.cuda.memory._record_memory_history(**self.record_args, clear_history=True)


class WorkerProfiler:
    """The profiling of one worker process over its roles ({role: its profiler config}). The roles of one process
    that trace (tool torch, enabled, this rank chosen) are all discrete or all not (validation checks it); one
    process-wide trace records what any of them asks (the union of their contents) and is written to each of their
    save_paths."""

    def __init__(self, worker: str, roles: dict[str, RoleConfig], global_cfg: GlobalProfilerConfig, rank: int,
                 device: torch.device):
        self.worker, self.rank, self.cuda = worker, rank, device.type == "cuda"
        self.traced = {role: c for role, c in roles.items()
                       if c.tool == "torch" and c.enable and rank_chosen(c, rank)}
        self.discrete = any([c.tool_config.torch.discrete for c in self.traced.values()])  # (all agree)
        self.contents = {x for c in self.traced.values() for x in c.tool_config.torch.contents}
        self.save_paths = list(dict.fromkeys(c.save_path for c in self.traced.values()))
        memory = [c for c in roles.values() if c.tool == "torch_memory"]
        self.memory = TorchMemory(memory[0], global_cfg, rank, rank_chosen(memory[0], rank)) if memory else None
        self.memory_on = self.memory is not None and memory[0].enable and rank_chosen(memory[0], rank)
        self.prof: torch.profiler.profile | None = None
        self.steps: list[int] = []
        self.written: list[str] = []  # trace files of the window
        self.parts: dict[str, int] = {}  # discrete traces of the window per phase and step

    def start(self, step: int) -> None:
        """Begin (or, with continuous steps, extend) a profiled window at training step `step`."""
        self.steps.append(step)
        if self.memory_on and self.memory is not None:
            self.memory.start(step)
        if self.traced and not self.discrete and self.prof is None:
            self.prof = torch_profile(self.contents, self.cuda)
            self.prof.start()

    def stop(self) -> list[str]:
        """End the window: write its trace (and memory snapshot); returns the window's trace files."""
        if self.prof is not None:
            self.prof.stop()
            first, last = self.steps[0], self.steps[-1]
            steps = f"step{first}" if first == last else f"steps{first}-{last}"
            self._export(self.prof, self.save_paths, f"{self.worker}_{steps}")
            self.prof = None
        if self.memory_on and self.memory is not None:
            self.memory.stop()
        written, self.written, self.steps, self.parts = self.written, [], [], {}
        return written

    @contextlib.contextmanager
    def phase(self, name: str, role: str):
        """One phase of a role: a labelled range of the window's trace, or its own trace (discrete)."""
        if not self.steps:  # not a profiled step
            yield
            return
        if not (self.discrete and role in self.traced):
            with torch.profiler.record_function(name):
                yield
            return
        cfg = self.traced[role]
        prof = torch_profile(set(cfg.tool_config.torch.contents), self.cuda)
        prof.start()
        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            prof.stop()
            label = f"{self.worker}_{name}_step{self.steps[-1]}"
            self.parts[label] = self.parts.get(label, 0) + 1  # a phase run again (validation's generation)
            self._export(prof, [cfg.save_path], label + (f"_part{self.parts[label]}" if self.parts[label] > 1 else ""))

    def _export(self, prof: torch.profiler.profile, save_paths: list[str | None], name: str) -> list[str]:
        written: list[str] = []
        for save_path in save_paths:
            assert save_path is not None  # validation (check_profiler) refuses a null save_path
            out = resolve_path(save_path)
            os.makedirs(out, exist_ok=True)
            path = os.path.join(out, f"{name}_rank{self.rank}.json.gz")
            if written:
                shutil.copyfile(written[0], path)
            else:
                prof.export_chrome_trace(path)
            written.append(path)
        log.info("profiler trace of %s written to %s", name, ", ".join(written))
        self.written += written
        return written


def profiled(name: str, role: str):
    """Decorate a worker method as phase `name` of `role` (the worker's `profiler` traces it on profiled steps)."""
    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            with self.profiler.phase(name, role):
                return method(self, *args, **kwargs)
        return run
    return wrap
