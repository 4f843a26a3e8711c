"""Configuration of the profiler (verl's `global_profiler` section and each role's `profiler` key), read by
`rlx.workers.profiling` and `rlx.trainer.profiling`; see docs/observability.md.

`global_profiler.steps` picks the training steps to profile; each role's `profiler.enable` / `all_ranks` / `ranks`
picks the worker processes that record them. Tools: torch (torch.profiler, a chrome trace per worker and step) and
torch_memory (CUDA memory history and snapshots); verl's nsys and npu are refused by name. The nsys/npu sub-keys
exist so that verl command lines that set them compose; they act only with their tool.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlx.config.roles import plan_roles


TORCH_CONTENTS = ("cuda", "cpu", "memory", "shapes", "stack")
"""What tool_config.torch.contents may list."""



@dataclass
class NsysToolConfig:
    discrete: bool = False
    """verl key of the nsys tool (refused): one report per task instead of per step."""


@dataclass
class GlobalNsysToolConfig:
    discrete: bool = False
    """verl key of the nsys tool (refused): one report per task instead of per step."""
    controller_nsight_options: dict = field(default_factory=lambda: {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"})
    """verl key of the nsys tool (refused): nsys options of the driver process."""
    worker_nsight_options: dict = field(default_factory=lambda: {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph",
        "capture-range": "cudaProfilerApi", "capture-range-end": None, "kill": "none"})
    """verl key of the nsys tool (refused): nsys options of the worker processes."""


@dataclass
class NPUToolConfig:
    contents: list = field(default_factory=list)
    """verl key of the npu tool (Ascend; refused): what to collect."""
    level: str = "level0"
    """verl key of the npu tool (refused): collection level."""
    analysis: bool = True
    """verl key of the npu tool (refused): parse the data when collection ends."""
    discrete: bool = False
    """verl key of the npu tool (refused): one trace per task instead of per step."""


@dataclass
class TorchScheduleConfig:
    skip_first: int = 0
    """verl key (not supported yet: only 0): update mini-batches skipped before the schedule starts."""
    wait: int = 0
    """verl key (not supported yet: only 0): idle mini-batches at the start of each cycle."""
    warmup: int = 0
    """verl key (not supported yet: only 0): warm-up mini-batches of each cycle."""
    active: int = 0
    """verl key (not supported yet: only 0, which records every mini-batch of the update): recorded mini-batches
    per cycle."""
    repeat: int = 0
    """verl key (not supported yet: only 0): number of cycles."""


@dataclass
class TorchToolConfig:
    contents: list = field(default_factory=list)
    """What the torch profiler records besides CPU operators: cuda (GPU kernels; cuda runs only) | cpu (always
    recorded) | memory (allocations: profile_memory) | shapes (operator input shapes: record_shapes) | stack (Python
    stacks: with_stack). Empty: CPU operators plus, on cuda, GPU kernels."""
    discrete: bool = False
    """False: one trace per worker process and profiled step (everything it runs: rollout, log-probs, update, and
    the checkpoint save of that step). True: one trace per phase of this role (e.g. actor_update)."""
    schedule: TorchScheduleConfig = field(default_factory=TorchScheduleConfig)
    """verl's torch.profiler schedule over update mini-batches (not supported yet: the whole update is recorded)."""


@dataclass
class TorchMemoryToolConfig:
    trace_alloc_max_entries: int = \
        "${global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries}"  # type: ignore[assignment]
    """CUDA allocator events kept in the memory history (torch.cuda.memory._record_memory_history's max_entries;
    follows global_profiler.global_tool_config.torch_memory)."""
    stack_depth: int = "${global_profiler.global_tool_config.torch_memory.stack_depth}"  # type: ignore[assignment]
    """Frames kept per recorded allocation stack (follows global_profiler.global_tool_config.torch_memory)."""
    memory_snapshot_num_steps: int = \
        "${global_profiler.global_tool_config.torch_memory.memory_snapshot_num_steps}"  # type: ignore[assignment]
    """A snapshot is written after this many profiled steps, covering them (follows
    global_profiler.global_tool_config.torch_memory)."""


@dataclass
class RoleToolConfig:
    nsys: NsysToolConfig = field(default_factory=lambda: NsysToolConfig(
        discrete="${global_profiler.global_tool_config.nsys.discrete}"))  # type: ignore[arg-type]
    """verl's nsys options (the tool is refused)."""
    npu: NPUToolConfig = field(default_factory=NPUToolConfig)
    """verl's npu options (the tool is refused)."""
    torch: TorchToolConfig = field(default_factory=TorchToolConfig)
    """Options of the torch tool."""
    torch_memory: TorchMemoryToolConfig = field(default_factory=TorchMemoryToolConfig)
    """Options of the torch_memory tool."""


@dataclass
class RoleProfilerConfig:
    """One role's profiler (actor, ref, critic): which of its ranks record the steps of global_profiler.steps."""

    tool: Optional[str] = "${global_profiler.tool}"
    """Tool of this role (follows global_profiler.tool): torch | torch_memory | null (off)."""
    enable: bool = False
    """Profile this role on the steps of global_profiler.steps."""
    all_ranks: bool = False
    """Profile every rank of the role."""
    ranks: list = field(default_factory=list)
    """Ranks to profile (with all_ranks=False); empty: rank 0."""
    save_path: Optional[str] = "${global_profiler.save_path}"
    """Where this role's traces go (follows global_profiler.save_path; relative: to the driver's working dir)."""
    tool_config: RoleToolConfig = field(default_factory=RoleToolConfig)
    """Per-tool options."""


@dataclass
class RolloutTorchToolConfig:
    contents: list = "${actor_rollout_ref.actor.profiler.tool_config.torch.contents}"  # type: ignore[assignment]
    """As actor's tool_config.torch.contents, for the rollout phase (follows the actor's)."""
    discrete: bool = "${actor_rollout_ref.actor.profiler.tool_config.torch.discrete}"  # type: ignore[assignment]
    """As actor's tool_config.torch.discrete, for the rollout phase (follows the actor's)."""
    profile_token_start: Optional[int] = None
    """verl key (not supported yet: only null): first response token of vLLM's engine-side trace."""
    profile_token_end: Optional[int] = None
    """verl key (not supported yet: only null): last response token of vLLM's engine-side trace."""


@dataclass
class RolloutToolConfig:
    npu: NPUToolConfig = field(default_factory=lambda: NPUToolConfig(**{  # type: ignore[arg-type]
        k: "${actor_rollout_ref.actor.profiler.tool_config.npu.%s}" % k for k in ("contents", "level", "analysis",
                                                                                  "discrete")}))
    """verl's npu options (the tool is refused; follow the actor's)."""
    torch: RolloutTorchToolConfig = field(default_factory=RolloutTorchToolConfig)
    """Options of the torch tool for the rollout phase."""


@dataclass
class RolloutProfilerConfig:
    """The rollout's profiler: the generation phase of the actor worker (rlx's rollout runs in that process).
    Every key follows the actor's profiler unless set."""

    tool: Optional[str] = "${global_profiler.tool}"
    """Tool of the rollout phase (follows global_profiler.tool)."""
    enable: bool = "${actor_rollout_ref.actor.profiler.enable}"  # type: ignore[assignment]
    """Profile the rollout phase (follows actor.profiler.enable)."""
    all_ranks: bool = "${actor_rollout_ref.actor.profiler.all_ranks}"  # type: ignore[assignment]
    """Profile every rank (follows actor.profiler.all_ranks)."""
    ranks: list = "${actor_rollout_ref.actor.profiler.ranks}"  # type: ignore[assignment]
    """Ranks to profile (follows actor.profiler.ranks); empty: rank 0."""
    save_path: Optional[str] = "${global_profiler.save_path}"
    """Where the rollout phase's traces go (follows global_profiler.save_path)."""
    tool_config: RolloutToolConfig = field(default_factory=RolloutToolConfig)
    """Per-tool options."""


@dataclass
class GlobalTorchMemoryConfig:
    trace_alloc_max_entries: int = 100_000
    """CUDA allocator events kept in the memory history (the default of every role's torch_memory options)."""
    stack_depth: int = 32
    """Frames kept per recorded allocation stack (every role's default)."""
    memory_snapshot_num_steps: int = 1
    """Profiled steps covered by one snapshot (every role's default)."""
    context: str = "all"
    """Allocator events recorded with their stack: all | alloc | state | null (none; torch's `context`)."""
    stacks: str = "all"
    """Stacks recorded: all (Python and C++) | python (torch's `stacks`)."""
    kw_args: dict = field(default_factory=dict)
    """Further keyword arguments of torch.cuda.memory._record_memory_history."""


@dataclass
class GlobalToolConfig:
    nsys: GlobalNsysToolConfig = field(default_factory=GlobalNsysToolConfig)
    """verl's nsys options (the tool is refused)."""
    torch_memory: GlobalTorchMemoryConfig = field(default_factory=GlobalTorchMemoryConfig)
    """Options of the torch_memory tool shared by every role."""


@dataclass
class GlobalProfilerConfig:
    tool: Optional[str] = None
    """Profiler of every role (each role's profiler.tool follows it): torch (torch.profiler: chrome traces) |
    torch_memory (CUDA memory history; snapshots on the profiled steps and at out-of-memory; cuda only) | null
    (off). verl's nsys and npu are refused."""
    steps: Optional[list] = None
    """Training steps to profile (1-based, as trainer steps are counted), e.g. [1,5]; null or []: none."""
    profile_continuous_steps: bool = False
    """Consecutive listed steps share one trace (e.g. steps [2,3] -> one trace of both) instead of one each."""
    save_path: str = "outputs/profile"
    """Directory of the traces (every role's default; relative: to the driver's working dir)."""
    global_tool_config: GlobalToolConfig = field(default_factory=GlobalToolConfig)
    """Options shared by the roles."""


ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
"""The roles with verl's full profiler options (the rollout has its own, smaller set)."""
_ROLLOUT = "actor_rollout_ref.rollout"
_NPU = ("contents", "level", "analysis", "discrete")

# verl keys accepted with their default only (merged into rlx.config.verl_compat.NOT_SUPPORTED)
NOT_SUPPORTED = {
    **{f"{r}.profiler.tool_config.torch.schedule.{k}": 0
       for r in ROLES for k in ("skip_first", "wait", "warmup", "active", "repeat")},
    f"{_ROLLOUT}.profiler.tool_config.torch.profile_token_start": None,
    f"{_ROLLOUT}.profiler.tool_config.torch.profile_token_end": None,
}

_NSYS = "inert unless the tool is nsys, which rlx refuses (as verl ignores it with another tool)"
_NPU_WHY = "inert unless the tool is npu, which rlx refuses (as verl ignores it with another tool)"
_DEPTH = ("torch.cuda.memory._record_memory_history has no stack-depth setting (verl passes it only to a torch that "
          "takes one): whole stacks are recorded")
# verl keys accepted with any value that act on nothing rlx runs (merged into rlx.config.verl_compat.NO_OP_BY_DESIGN)
NO_OP_BY_DESIGN = {
    **{f"{r}.profiler.tool_config.nsys.discrete": _NSYS for r in ROLES},
    **{f"global_profiler.global_tool_config.nsys.{k}": _NSYS
       for k in ("discrete", "controller_nsight_options", "worker_nsight_options")},
    **{f"{r}.profiler.tool_config.npu.{k}": _NPU_WHY for r in ROLES + (_ROLLOUT,) for k in _NPU},
    **{f"{r}.profiler.tool_config.torch_memory.stack_depth": _DEPTH for r in ROLES},
    "global_profiler.global_tool_config.torch_memory.stack_depth": _DEPTH,
}


PROFILER_TOOLS = (None, "torch", "torch_memory")
REFUSED_PROFILER_TOOLS = {
    "nsys": "NVIDIA Nsight Systems needs the workers started under nsys (verl's Ray runtime-env hook), which rlx does "
            "not do; for GPU kernels and timelines use global_profiler.tool=torch (its traces hold the CUDA kernels)",
    "npu": "Ascend NPUs are not a device rlx runs on",
    "precision_debugger": "msprobe's precision debugger is Ascend tooling rlx does not integrate",
}


def profiler_roles(cfg) -> dict:
    """{key of a role's profiler: its config} of the roles this job builds; the actor worker's ones first."""
    arr = cfg.actor_rollout_ref
    roles = {"actor_rollout_ref.actor.profiler": arr.actor.profiler,
             "actor_rollout_ref.rollout.profiler": arr.rollout.profiler}
    built = plan_roles(cfg)
    if built.ref:
        roles["actor_rollout_ref.ref.profiler"] = arr.ref.profiler
    if built.critic:
        roles["critic.profiler"] = cfg.critic.profiler
    return roles


def check_profiler(cfg, errors):
    """global_profiler.* and the roles' profiler keys (rlx.workers.profiling)."""
    g = cfg.global_profiler
    tools = {"global_profiler.tool": g.tool,  # a role's own tool is named where it is not the global one it follows
             **{f"{k}.tool": c.tool for k, c in profiler_roles(cfg).items() if c.tool != g.tool}}
    for key, tool in tools.items():
        if tool in REFUSED_PROFILER_TOOLS:
            errors.append(f"{key}={tool} is not supported by rlx: {REFUSED_PROFILER_TOOLS[tool]}. Fix: "
                          f"global_profiler.tool=torch (chrome traces) or torch_memory (CUDA memory snapshots).")
        elif tool not in PROFILER_TOOLS:
            errors.append(f"{key}={tool!r} is not valid; choose one of {list(PROFILER_TOOLS)}. Fix: {key}=torch, "
                          f"or null.")
        elif tool == "torch_memory" and cfg.trainer.device != "cuda":
            errors.append(f"{key}=torch_memory records CUDA's allocator and needs trainer.device=cuda (this run: "
                          f"{cfg.trainer.device}). Fix: global_profiler.tool=torch (its contents=[memory] records "
                          f"CPU allocations too), or run on GPUs.")
    steps = g.steps or []
    if not isinstance(steps, list) or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in steps):
        errors.append(f"global_profiler.steps={g.steps!r} must be a list of training steps (1, 2, ...) or null. "
                      f"Fix: global_profiler.steps=[1,2], or null.")
    traced = {}
    for key, c in profiler_roles(cfg).items():
        contents = c.tool_config.torch.contents
        bad = [x for x in contents if x not in TORCH_CONTENTS]
        if bad:
            errors.append(f"{key}.tool_config.torch.contents has {bad}; choose among {list(TORCH_CONTENTS)}. Fix: "
                          f"remove {bad}.")
        if "cuda" in contents and cfg.trainer.device != "cuda":
            errors.append(f"{key}.tool_config.torch.contents has cuda (GPU kernels) but trainer.device="
                          f"{cfg.trainer.device}. Fix: leave cuda out (CPU operators are always recorded).")
        if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in c.ranks):
            errors.append(f"{key}.ranks={c.ranks!r} must list ranks (0, 1, ...). Fix: {key}.ranks=[0].")
        if not c.save_path and (c.tool == "torch_memory" or (c.tool == "torch" and c.enable)):
            errors.append(f"{key}.save_path={c.save_path!r}: the profiler writes its output there. Fix: "
                          f"{key}.save_path=<a folder>, or leave it unset (it follows global_profiler.save_path).")
        if c.tool == "torch" and c.enable and not key.startswith("critic."):
            traced[key] = c.tool_config.torch.discrete
    if len(set(traced.values())) > 1:  # one process, one torch profiler at a time
        shown = ", ".join(f"{k}.tool_config.torch.discrete={v}" for k, v in traced.items())
        errors.append(f"the actor, rollout and ref phases run in one process, whose profiler is either one trace "
                      f"per step or one per phase: {shown} differ. Fix: give them the same value.")
