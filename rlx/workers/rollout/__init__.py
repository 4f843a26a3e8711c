"""Rollouts: `hf` (an HF model copy in the worker, synced from FSDP, sampled with a KV cache) and `vllm` (an
in-process vLLM engine per rank).

`build_rollout("vllm" | "hf", **kwargs)` imports the chosen implementation lazily, so importing this package
never pulls in vLLM. `build_engine(engine, ...)` builds the engine a job plan names (rlx.plan) from the arguments
both share. This module is where what differs between the engines is decided by their name (with rlx.plan, which
resolves the name): nothing else compares engine names.
"""
from __future__ import annotations

from rlx.config.device import VLLM_INSTALL_HINT, vllm_available
from rlx.config.schema import RolloutConfig


def build_rollout(name: str, **kwargs):
    """Build the rollout called `name`; `kwargs` go to its constructor.

    * ``vllm``: `VLLMRollout(model_path, rollout_cfg, *, max_prompt_length, max_response_length, rank,
      world_size, pad_token_id, eos_token_id, dtype, device)`
    * ``hf``:   `HFRollout(model_path, *, max_response_length, pad_token_id, eos_token_id, device, ...)`
    """
    name = (name or "hf").lower()
    if name == "vllm":
        if not vllm_available():
            raise ImportError(VLLM_INSTALL_HINT)
        from rlx.workers.rollout.vllm_rollout import VLLMRollout
        return VLLMRollout(**kwargs)
    if name in ("hf", "naive", "hf_generate"):
        from rlx.workers.rollout.hf_rollout import HFRollout
        return HFRollout(**kwargs)
    raise ValueError(f"rollout.name={name!r}: unknown rollout; choose 'vllm' or 'hf'")


def build_engine(engine: str, *, model_path: str, rollout_cfg: RolloutConfig, max_prompt_length: int,
                 max_response_length: int, rank: int, world_size: int, pad_token_id: int, eos_token_id,
                 dtype: str, device, trust_remote_code: bool, offload_when_released: bool = False):
    """The generation engine `engine` (vllm | hf, as a job plan names it) over `model_path` on `device` (a
    torch.device), with what each takes: vLLM reads `rollout_cfg`'s engine settings (sleep mode, tensor
    parallelism, ...), hf its calculate_log_probs and ignore_eos. `dtype`: a torch dtype's name. With
    `offload_when_released` the hf model moves to the CPU between calls on a GPU (vLLM sleeps by
    rollout_cfg.free_cache_engine)."""
    if engine == "vllm":
        return build_rollout("vllm", model_path=model_path, rollout_cfg=rollout_cfg,
                             max_prompt_length=max_prompt_length, max_response_length=max_response_length,
                             rank=rank, world_size=world_size, pad_token_id=pad_token_id,
                             eos_token_id=eos_token_id, dtype=dtype, device=device.type,
                             trust_remote_code=trust_remote_code)
    import torch

    extra = {"offload_when_released": True} if offload_when_released and device.type == "cuda" else {}
    return build_rollout("hf", model_path=model_path, max_response_length=max_response_length,
                         pad_token_id=pad_token_id, eos_token_id=eos_token_id, device=device,
                         dtype=getattr(torch, dtype), calculate_log_probs=rollout_cfg.calculate_log_probs,
                         trust_remote_code=trust_remote_code, ignore_eos=rollout_cfg.ignore_eos, **extra)


def rank_seed(engine: str, seed: int, rank: int) -> int:
    """The sampling seed rank `rank` hands its engine for the driver's `seed`: hf gets one per rank (each rank
    samples its own responses); vLLM derives per-data-parallel-rank seeds itself (tensor-parallel aware)."""
    return seed if engine == "vllm" else seed * 1000 + rank


def agent_server(engine: str, rollout, meta: dict, *, pad_to: int, calc_log_probs: bool):
    """The agent loop's server over this rank's engine (rlx.workers.rollout.agent.servers): continuous batching on
    vLLM's engine, or batches of pending requests (left-padded to at least `pad_to`) on hf."""
    from rlx.workers.rollout.agent.servers import HFServer, VLLMServer

    if engine == "vllm":
        return VLLMServer(rollout, meta, calc_log_probs)
    return HFServer(rollout, meta, pad_to=pad_to, calc_log_probs=calc_log_probs)
