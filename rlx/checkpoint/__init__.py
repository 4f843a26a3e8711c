"""Checkpoints. The driver's side: `manager` (save a step, resume a run, one call each) over `store` (step folders,
manifests and verification, the latest pointer, rotation, the driver's state, the choice of the step to resume
from) and `lock` (one run per folder). The workers' side: `engine_state` (an engine's sharded save and load) and
`export` (HF model and LoRA adapter folders); `space` (a checkpoint's size before the run, the disk-full line). Beneath both: `safety` (loading runs no code from a file, and loads
only whole checkpoints), `errors` (the refusals) and `files` (atomic, collective writes).

The names below load lazily, so that `rlx.checkpoint.errors` or `.lock` costs no torch import where it is only
caught or taken (the command line, before the run's checks).
"""
_MODULES = {
    "engine_state": ("ADAPTER_DIR", "CONTENTS", "EXPORTS", "HF_DIR", "load_engine", "resave_extra", "save_engine"),
    "errors": ("CheckpointDirLocked", "DamagedCheckpointError", "UnsafeCheckpointError"),
    "export": ("export_adapter", "export_hf"),
    "manager": ("CheckpointManager",),
    "safety": ("check_extra_files", "load_extra"),
    "store": ("COMPLETE", "DRIVER_STATE", "LATEST", "check_resume_files", "find_resume_dir", "is_complete",
              "list_steps", "load_driver_state", "mark_complete", "rotate", "save_driver_state", "step_dir", "verify",
              "write_latest"),
}
_EXPORTS = {name: f"rlx.checkpoint.{module}" for module, names in _MODULES.items() for name in names}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
