"""`trainer` and `ray_init`: the run (steps, devices, checkpoints, loggers) and its Ray cluster, and their rules.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from rlx.config.profiler import profiler_roles
from rlx.config.rules import choice


LOGGERS = ("console", "file", "tensorboard", "wandb", "swanlab")
LEGACY_WORKER_IMPL = ("auto", "enable", "disable")  # verl's values (any other is verl's ValueError too)


@dataclass
class TrainerConfig:
    balance_batch: bool = True
    """Reorder each training batch so that every data-parallel rank gets the same number of rows and about the
    same number of tokens (verl's balance_batch; logs global_seqlen/*)."""
    total_epochs: int = 30
    """Epochs over the training set."""
    total_training_steps: Optional[int] = None
    """Stop after this many steps (null: total_epochs over the data)."""
    project_name: str = "verl_examples"
    """Project name (loggers, checkpoint dir)."""
    experiment_name: str = "gsm8k"
    """Experiment name (loggers, checkpoint dir)."""
    logger: list = choice(default_factory=lambda: ["console", "wandb"], choices=LOGGERS)
    """Loggers: console | file (metrics.jsonl under <default_local_dir>/logs) | tensorboard | wandb | swanlab (the
    optional extra rlx[swanlab]; wandb and swanlab log offline to <default_local_dir>/logs without an API key)."""
    log_val_generations: int = 0
    """Validation samples (prompt, response, score) logged per validation, chosen as verl does (sorted, then
    shuffled with seed 42): printed by the console logger, a text/table entry for tensorboard/wandb, a
    val_generations record for file."""
    nnodes: int = 1
    """Nodes."""
    n_gpus_per_node: int = 8
    """Workers per node (GPUs, or CPU processes with device=cpu)."""
    device: str = choice("auto", ("cpu", "cuda"))  # `auto` is resolved at load (rlx.config.device)
    """auto | cuda (nccl) | cpu (gloo). auto: cuda when the driver sees a GPU, else cpu (a driver joining a cluster
    from a machine without GPUs must say cuda)."""
    use_legacy_worker_impl: str = choice("auto", LEGACY_WORKER_IMPL)
    """verl key: auto | enable | disable picks between verl's two worker implementations (its legacy FSDP workers
    and its newer engine workers), which train the same model. rlx has one worker implementation, so every value
    verl accepts runs the same; another value is refused, as verl refuses it."""
    save_freq: int = -1
    """Save a checkpoint every N steps (-1: never)."""
    resume_mode: str = choice("auto", ("auto", "disable", "resume_path"))
    """auto | disable | resume_path."""
    resume_from_path: Optional[str] = None
    """Checkpoint dir used with resume_mode=resume_path."""
    val_before_train: bool = True
    """Validate before the first step."""
    val_only: bool = False
    """Only validate."""
    test_freq: int = -1
    """Validate every N steps (-1: only before training and at the end)."""
    critic_warmup: int = 0
    """Steps that update only the critic."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Checkpoint and log root (a relative path is relative to the driver's working directory; a `ray job submit`
    job needs an absolute one)."""
    default_hdfs_dir: Optional[str] = None
    """verl key (not supported yet)."""
    del_local_ckpt_after_load: bool = False
    """verl key (not supported yet)."""
    max_actor_ckpt_to_keep: Optional[int] = None
    """Keep at most this many actor checkpoints (null: all)."""
    max_critic_ckpt_to_keep: Optional[int] = None
    """Keep at most this many critic checkpoints (null: all)."""
    on_damaged_checkpoint: str = choice("previous", ("previous", "error"))
    """Resume when the newest checkpoint fails its checksums (COMPLETE records one per file): previous (resume from
    the newest earlier checkpoint that verifies; the damaged file is reported) | error (stop)."""
    max_consecutive_skipped_steps: int = 3
    """Stop the run (non-zero exit) after this many consecutive training steps whose optimizer step was skipped
    for a non-finite gradient norm (actor or critic; counted in actor/skipped_steps, critic/skipped_steps).
    0: never stop."""
    rollout_data_dir: Optional[str] = None
    """Write each training step's rollouts to <dir>/<step>.jsonl (input, output, gts, score, step, the reward
    function's extra values), as verl does; null: none."""
    validation_data_dir: Optional[str] = None
    """Write each validation's samples to <dir>/<step>.jsonl (input, output, gts, score, step); null: none."""
    seed: int = 0
    """Seed of model init and sampling."""


@dataclass
class RayInitConfig:
    address: Optional[str] = None
    """Ray cluster to join: auto (the cluster `ray start` started on this machine) or <head-ip>:6379; null:
    RAY_ADDRESS if set, else a new local Ray (never one found in Ray's temp folder)."""
    num_cpus: Optional[int] = None
    """CPUs of a local Ray (null: all)."""
    timeline_json_file: Optional[str] = None
    """Write Ray's task timeline (chrome://tracing JSON) to this file when the run ends."""


def check_trainer(cfg, errors):
    """Counts, resume and loggers (trainer.device, resume_mode, logger, ... are declared choices)."""
    t = cfg.trainer
    if t.log_val_generations < 0:
        errors.append(f"trainer.log_val_generations={t.log_val_generations} must be >= 0 (0: none). Fix: "
                      f"trainer.log_val_generations=0.")
    if t.max_consecutive_skipped_steps < 0:
        errors.append(f"trainer.max_consecutive_skipped_steps={t.max_consecutive_skipped_steps} must be >= 0 "
                      f"(0: never stop on skipped steps). Fix: trainer.max_consecutive_skipped_steps=3.")
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        errors.append("trainer.resume_mode=resume_path needs the checkpoint to resume from. Fix: "
                      "trainer.resume_from_path=<a global_step_N dir>, or trainer.resume_mode=auto.")
    # the loggers' packages (wandb, swanlab): rlx.trainer.probes
    if t.total_training_steps is not None and t.total_training_steps <= 0:
        errors.append(f"trainer.total_training_steps={t.total_training_steps} must be positive or null. Fix: "
                      f"trainer.total_training_steps=null (trainer.total_epochs decides).")


def in_ray_job() -> bool:
    """True in the driver of a `ray job submit` job (the job supervisor sets this variable)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def local_dir_writers(cfg) -> list[str]:
    """What the job will write under `trainer.default_local_dir` (empty: nothing, so its path does not matter):
    checkpoints, the file logger, tensorboard's event files (unless TENSORBOARD_DIR names their place), wandb's
    local files (unless WANDB_DIR does), swanlab's (unless SWANLAB_LOG_DIR does)."""
    t = cfg.trainer
    loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    writers = []
    if t.save_freq > 0:
        writers.append(f"checkpoints (trainer.save_freq={t.save_freq})")
    if "file" in loggers:
        writers.append("the file logger's metrics.jsonl (trainer.logger has file)")
    if "tensorboard" in loggers and not os.environ.get("TENSORBOARD_DIR"):
        writers.append("tensorboard event files (trainer.logger has tensorboard, TENSORBOARD_DIR is unset)")
    if "wandb" in loggers and not os.environ.get("WANDB_DIR"):
        writers.append("wandb's local files (trainer.logger has wandb, WANDB_DIR is unset)")
    if "swanlab" in loggers and not os.environ.get("SWANLAB_LOG_DIR"):
        writers.append("swanlab's local files (trainer.logger has swanlab, SWANLAB_LOG_DIR is unset)")
    return writers


def check_output_paths(cfg, errors):
    """Under `ray job submit` the driver's working directory is Ray's temporary copy of --working-dir, deleted when
    the job ends: whatever the job writes must go to an absolute path. A relative path the job never writes to
    (`trainer.default_local_dir` of a job without checkpoints or file logs) is fine."""
    if not in_ray_job():
        return
    t = cfg.trainer
    paths = {}
    writers = local_dir_writers(cfg)
    if writers:
        paths["trainer.default_local_dir"] = (t.default_local_dir, ", ".join(writers) + " go there")
    if t.resume_mode == "resume_path":
        paths["trainer.resume_from_path"] = (t.resume_from_path, "the checkpoint to resume from is read there")
    for key, c in profiler_roles(cfg).items():  # traces and memory snapshots
        if c.tool == "torch_memory" or (c.tool == "torch" and c.enable and cfg.global_profiler.steps):
            paths[f"{key}.save_path"] = (c.save_path, "profiler output goes there")
    if cfg.ray_init.timeline_json_file:
        paths["ray_init.timeline_json_file"] = (cfg.ray_init.timeline_json_file, "Ray's timeline is written there")
    loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    env_keys = [k for name, k in (("tensorboard", "TENSORBOARD_DIR"), ("wandb", "WANDB_DIR"),
                                  ("swanlab", "SWANLAB_LOG_DIR")) if name in loggers]
    paths.update({f"the environment variable {k}": (os.environ.get(k), "logs go there") for k in env_keys})
    for key, (path, why) in paths.items():
        if path and not os.path.isabs(os.path.expanduser(path)):
            errors.append(f"{key}={path!r} is a relative path ({why}), and this driver runs as a Ray job in Ray's "
                          f"temporary copy of the working dir ({os.getcwd()}), deleted when the job ends. Fix: give "
                          f"an absolute path on the head node (or shared storage), e.g. {key.split()[-1]}="
                          f"/abs/path/{path.lstrip('./')}.")
