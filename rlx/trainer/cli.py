"""The command line: `python -m rlx.trainer.main_ppo key=value ...` (verl's key names; rlx.trainer.main_ppo is verl's
module name for it, a shim over `main` here).

compose + strict key check -> typed config -> validate -> the job plan (rlx.plan) -> preflight (data, model, reward,
checkpoints; all before Ray starts) -> `rlx.trainer.launch.run` (ray.init, trainer.fit()). `--cfg job|hydra|all` and
`--help` answer as a Hydra app does; `--check` stops after the preflight and prints what would run.
Exit codes: 0 done, 1 training stopped (a garbage reward, skipped steps, a damaged checkpoint), 2 the command line,
config or inputs are wrong, or another run holds trainer.default_local_dir (nothing started), 130 Ctrl-C, 143 SIGTERM.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the entry point imports lazily, so that --help and a bad override answer fast
    from rlx.config.schema import RLXConfig
    from rlx.plan import JobPlan


@dataclass
class CliArgs:
    """What a command line asks for: Hydra's flags (the subset rlx implements) and the key=value overrides."""
    overrides: list[str] = field(default_factory=list)
    config_dir: str | None = None
    """--config-path/-cp: a directory with the user's own YAML (relative: to rlx/trainer/ as in Hydra, then to the
    working directory; rlx.config.config_path)."""
    config_name: str = "ppo_trainer"
    """--config-name/-cn: the YAML file (.yaml optional) to compose: ppo_trainer (verl's defaults), quickstart
    (rlx's small default job, what `make run` runs) or the user's, whose `defaults` may name ppo_trainer."""
    cfg: str | None = None
    """--cfg/-c job|hydra|all: print the composed config and exit, as a Hydra app does."""
    resolve: bool = False
    """--resolve: with --cfg, resolve ${...} interpolations."""
    package: str | None = None
    """--package/-p KEY: with --cfg, print only that node."""
    help: bool = False
    """--help/-h."""
    check: bool = False
    """--check: compose, validate and run the preflight, print what would run, exit 0 (or 2) without starting Ray."""


class UsageError(ValueError):
    """A command-line flag rlx does not understand (the overrides are checked by the config loader)."""


_VALUE_FLAGS = {"--config-path": "config_dir", "-cp": "config_dir", "--config-name": "config_name",
                "-cn": "config_name", "--cfg": "cfg", "-c": "cfg", "--package": "package", "-p": "package"}
_SWITCHES = {"--help": "help", "-h": "help", "--resolve": "resolve", "--check": "check", "--run": None, "-r": None}
_HYDRA_ONLY = ("--multirun", "-m", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--config-dir",
               "-cd", "--experimental-rerun", "--version")
CFG_CHOICES = ("job", "hydra", "all")


def parse_argv(argv: list[str]) -> CliArgs:
    """Split Hydra-style flags (`--cfg job`, `--cfg=job`, `-c job`, `--help`, `--config-path`, ...) from
    key=value overrides."""
    args = CliArgs()
    it = iter(argv)
    for arg in it:
        if not arg.startswith("-"):
            args.overrides.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if name in _VALUE_FLAGS:
            if not eq:
                following = next(it, None)
                if following is None or following.startswith("-"):
                    raise UsageError(f"{name} needs a value")
                value = following
            setattr(args, _VALUE_FLAGS[name], value)
        elif name in _SWITCHES and not eq:
            switch = _SWITCHES[name]  # None: a flag rlx accepts and needs nothing for
            if switch:
                setattr(args, switch, True)
        elif name in _HYDRA_ONLY:
            raise UsageError(f"{name} is a Hydra flag rlx does not implement (rlx runs one job per command)")
        else:
            raise UsageError(f"unknown option {arg!r}")
    if args.check and args.cfg is not None:
        raise UsageError("--check and --cfg are two answers; give one")
    if args.cfg is not None and args.cfg not in CFG_CHOICES:
        raise UsageError(f"--cfg {args.cfg!r}: choose one of {list(CFG_CHOICES)}")
    return args


def usage() -> str:
    """`--help`: usage, the config groups (sections of the tree) and where every key is documented."""
    import dataclasses
    import typing

    from rlx.config.export import field_docs
    from rlx.config.loader import CONFIG_DIR
    from rlx.config.schema import RLXConfig

    lines = ["usage: python -m rlx.trainer.main_ppo [--config-path DIR] [--config-name NAME] [--check] [key=value ...]",
             "       python -m rlx.trainer.main_ppo --cfg job|hydra|all [--resolve] [--package KEY] [key=value ...]",
             "",
             "Train an LLM with PPO / GRPO / RLOO (verl's key names: paste a verl command line, swap the model path).",
             "",
             "== Config groups ==",
             "Override any key of these groups on the command line: group.key=value (e.g. data.train_batch_size=64).",
             ""]

    def groups(cls, prefix: str, depth: int) -> None:
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                lines.append(f"  {prefix + f.name:<44} {docs.get(f.name, '')}")
                if depth < 1:
                    groups(hints[f.name], prefix + f.name + ".", depth + 1)

    groups(RLXConfig, "", 0)
    lines += ["",
              "Every key, with its default and a comment: " + str(CONFIG_DIR / "ppo_trainer.yaml"),
              "(rlx/trainer/config/ppo_trainer.yaml in the repository; README.md, section Configuration).",
              "Its defaults are verl's; rlx's small ready-to-run job is --config-name quickstart (quickstart.yaml).",
              "The composed config of a command line: add --cfg job.",
              "",
              "== Flags ==",
              "  --cfg, -c job|hydra|all    print the composed config and exit (job: rlx's config; hydra: Hydra's",
              "                             own settings; all: both)",
              "  --resolve                  with --cfg: resolve ${...} interpolations",
              "  --package, -p KEY          with --cfg: print only that node (e.g. -p actor_rollout_ref.rollout)",
              "  --config-path, -cp DIR     directory of your own YAML config (default: rlx's); its `defaults` may",
              "                             name ppo_trainer (rlx's). Relative: to rlx/trainer/ (Hydra's rule), then",
              "                             to the working directory",
              "  --config-name, -cn NAME    the config to compose, .yaml optional (default: ppo_trainer, verl's",
              "                             defaults; quickstart: rlx's tiny GRPO job, what `make run` runs)",
              "  --check                    compose, validate and run the preflight (models, data, reward,",
              "                             checkpoints), print what would run (roles, world size, engines,",
              "                             offload), exit 0, or 2 with every error; Ray is not started",
              "  --help, -h                 this help"]
    return "\n".join(lines)


def print_config(args: CliArgs) -> None:
    """`--cfg job|hydra|all`: the composed config as YAML (`job` is rlx's full tree, schema defaults included)."""
    from omegaconf import OmegaConf

    from rlx.config.loader import compose_with_hydra, load_config, merge_schema

    job, hydra_cfg = compose_with_hydra(args.overrides, args.config_dir, args.config_name, hydra=args.cfg != "job")
    job = merge_schema(job)

    def dump(node, resolve: bool) -> str:
        try:
            return OmegaConf.to_yaml(node, resolve=resolve)
        except Exception:  # noqa: BLE001 - Hydra's own ${hydra:...} resolvers only work inside a Hydra run
            return OmegaConf.to_yaml(node)

    if args.package:
        root = OmegaConf.create({"hydra": hydra_cfg}) if args.package.split(".")[0] == "hydra" else job
        node = OmegaConf.select(root, args.package, default=None)
        if node is None:
            raise ValueError(f"--package {args.package!r}: no such node in the composed config")
        text = dump(node, args.resolve) if OmegaConf.is_config(node) else f"{node}\n"
        print(f"# @package {args.package}\n{text}", end="")
        return
    if args.cfg in ("hydra", "all"):
        print("# hydra: Hydra's own settings. rlx composes its config through Hydra's compose API and does not use\n"
              "# Hydra's run directories, job logging or launchers.")
        print(dump(OmegaConf.create({"hydra": hydra_cfg}), args.resolve), end="")
    if args.cfg in ("job", "all"):
        print(dump(job, args.resolve), end="")
        sys.stdout.flush()
        try:  # Hydra prints without running the app; rlx also says whether a run would pass validation
            load_config(args.overrides, args.config_dir, args.config_name)
        except ValueError as e:
            print(f"rlx: note: a run with this config would stop before it starts:\n{e}", file=sys.stderr)


def unused_section_notes(overrides: list[str], cfg: RLXConfig, plan: JobPlan) -> list[str]:
    """One line per section whose keys the command line sets but this job (`plan`) never builds: critic.* when the
    estimator trains no critic (anything but gae), actor_rollout_ref.ref.* when no reference policy is built
    (neither actor.use_kl_loss nor algorithm.use_kl_in_reward). Nothing is refused: verl accepts them too."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlx.config.loader import parse_override

    parser = OverridesParser.create()
    keys = list(dict.fromkeys(parse_override(parser, raw).key_or_group for raw in overrides))
    notes = []
    estimator = cfg.algorithm.adv_estimator
    critic_keys = [k for k in keys if k.startswith("critic.")]
    if critic_keys and not plan.roles.critic:
        notes.append(f"rlx: note: {', '.join(critic_keys)} unused: algorithm.adv_estimator={estimator} trains no "
                     f"critic (only gae does)")
    ref_keys = [k for k in keys if k.startswith("actor_rollout_ref.ref.")]
    if ref_keys and not plan.roles.ref:
        notes.append(f"rlx: note: {', '.join(ref_keys)} unused: no reference policy is built "
                     f"(actor_rollout_ref.actor.use_kl_loss=False and algorithm.use_kl_in_reward=False)")
    return notes


def rollout_queue_notes(cfg: RLXConfig, plan: JobPlan) -> list[str]:
    """A line when a rollout pool's vLLM engine is handed more requests at once than
    actor_rollout_ref.rollout.max_num_seqs runs: with partial rollout every admitted batch (staleness + 1 of them) is
    in flight together, and the requests beyond max_num_seqs wait for a free slot (first come, first served: a later
    batch takes the slots an earlier one frees). Nothing is refused: which is faster depends on the engine's cost per
    step at each concurrency."""
    if plan.async_ is None or not plan.rollout.continuous_batching:
        return []
    from rlx.plan import ROLLOUT_POOL

    rollout = cfg.actor_rollout_ref.rollout
    batches = plan.async_.staleness + 1 if plan.async_.partial_rollout else 1
    engines = max(1, plan.placement.pools[ROLLOUT_POOL].world_size // plan.rollout.tensor_parallel_size)
    per_engine = -(-batches * cfg.data.train_batch_size * rollout.n // engines)
    if per_engine <= rollout.max_num_seqs:
        return []
    return [f"rlx: note: each rollout engine holds up to {per_engine} requests at once ({batches} batch(es) of "
            f"data.train_batch_size={cfg.data.train_batch_size} x rollout.n={rollout.n} over {engines} engine(s)), "
            f"more than actor_rollout_ref.rollout.max_num_seqs={rollout.max_num_seqs}: the rest wait for a free slot, "
            f"the oldest batch's first. To run them all at once: actor_rollout_ref.rollout.max_num_seqs={per_engine}, "
            f"if its KV cache holds them"]


def _base_config_hint(args: CliArgs) -> str:
    """After an error of a job on the base config (verl's defaults): where rlx's ready-to-run job is."""
    if args.config_dir is not None or args.config_name != "ppo_trainer":
        return ""
    return ("\n(The base config has verl's defaults: set the model, the data and the per-GPU batch sizes as a verl "
            "command does. rlx's small ready-to-run job: --config-name quickstart, or `make run`.)")


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit code."""
    from rlx.trainer.launch import ended_by_sigterm, sigterm_unwinds

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        args = parse_argv(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"rlx: {e}. See --help.", file=sys.stderr)
        return 2
    if args.help:
        print(usage())
        return 0
    job = _Job(args)
    with sigterm_unwinds():  # from here on SIGTERM ends the run as Ctrl-C does, whenever it comes
        try:
            return job.run()
        except BaseException as e:
            # SIGTERM: `Terminated`, or whatever it surfaced as where the handler's exception met C code (a
            # SystemError) or a cleanup; the run ends the same way every time
            if isinstance(e, KeyboardInterrupt) and not ended_by_sigterm(e):
                print(job.stop_line("interrupted (Ctrl-C)", e), file=sys.stderr, flush=True)
                return 130
            if not ended_by_sigterm(e):
                raise
            print(job.stop_line("SIGTERM", e), file=sys.stderr, flush=True)
            return 143  # 128 + SIGTERM, what a shell reports for a process the signal ended


class _Job:
    """One command line's job: config, plan, preflight, run; keeps the config for the line said when a signal ends
    it."""

    def __init__(self, args: CliArgs):
        self.cfg: RLXConfig | None
        self.args, self.cfg = args, None

    def stop_line(self, what: str, e: BaseException) -> str:
        """The one line that ends a run stopped by SIGTERM or Ctrl-C, after the workers and Ray are stopped."""
        from rlx.trainer.launch import last_checkpoint_note

        step = getattr(e, "step", None)  # set by launch.run once the trainer exists
        where = f"at step {step}: stopped the workers." if step is not None else "before training started."
        return f"rlx: {what} {where} {last_checkpoint_note(self.cfg) if self.cfg is not None else ''}".rstrip()

    def run(self) -> int:
        from rlx.config.loader import OverrideParseError
        from rlx.config.value_types import ConfigValueError
        from rlx.trainer.check import check_before_ray

        args = self.args
        try:
            if args.cfg:
                try:
                    print_config(args)
                except BrokenPipeError:  # `--cfg job | head`: the reader left; not an error
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            notes: list[str] = []
            # every problem of every stage before Ray (unknown keys, the rules, the preflight), in one round
            checked = check_before_ray(args.overrides, args.config_dir, args.config_name, notes,
                                       composed=lambda cfg: setattr(self, "cfg", cfg))
        except (OverrideParseError, ConfigValueError) as e:  # one line: the key, the value, the fix
            print(f"rlx: {e}", file=sys.stderr)
            return 2
        except ValueError as e:
            print(f"rlx: config error\n{e}{_base_config_hint(args)}", file=sys.stderr)
            return 2
        from rlx.checkpoint.errors import CheckpointDirLocked, CheckpointSaveError, DamagedCheckpointError
        from rlx.trainer.launch import WorkerDied, last_checkpoint_note, run
        from rlx.trainer.stopping import TrainingStopped

        cfg = self.cfg = checked.cfg
        plan, inputs = checked.plan, checked.inputs
        later = [] if plan is None else unused_section_notes(args.overrides, cfg, plan) + rollout_queue_notes(cfg, plan)
        for note in notes + later:
            print(note, file=sys.stderr, flush=True)  # said once, before Ray starts
        if not checked.ok:
            print(checked.report() + _base_config_hint(args), file=sys.stderr)
            if args.check:
                from rlx.trainer.check import devices

                print(f"rlx: check failed (nothing started); device {devices(cfg)}", file=sys.stderr)
            return 2
        assert plan is not None  # made whenever the config's rules pass
        if args.check:
            from rlx.trainer.check import describe

            print(describe(cfg, plan, inputs), flush=True)
            return 0
        try:
            run(cfg, plan, inputs)
        except CheckpointDirLocked as e:
            print(f"rlx: {e}", file=sys.stderr)
            return 2
        except (TrainingStopped, DamagedCheckpointError) as e:
            print(f"rlx: training stopped: {e}", file=sys.stderr)
            return 1
        except WorkerDied as e:  # its log's last lines, then one line
            for path, tail in e.logs:
                if tail:
                    print(f"last lines of {path}:\n  " + "\n  ".join(tail), file=sys.stderr)
            at = f" at step {e.step}" if e.step is not None else ""
            print(f"rlx: training stopped{at}: {e}. {last_checkpoint_note(cfg)}", file=sys.stderr, flush=True)
            return 1
        except CheckpointSaveError as e:  # full, read-only, another OSError: the steps before are whole
            print(f"rlx: training stopped: {e} {last_checkpoint_note(cfg)}", file=sys.stderr, flush=True)
            return 1
        return 0


if __name__ == "__main__":
    from rlx.trainer.console import keep_worker_output_in_ray_logs

    keep_worker_output_in_ray_logs()  # before anything imports Ray
    sys.exit(main())
