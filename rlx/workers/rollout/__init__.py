"""Rollouts: `hf` (an HF model copy in the worker, synced from FSDP, sampled with a KV cache) and `vllm` (an
in-process vLLM engine per rank).

`build_rollout("vllm" | "hf", **kwargs)` imports the chosen implementation lazily, so importing this package
never pulls in vLLM.
"""
from __future__ import annotations

from rlx.config.device import VLLM_INSTALL_HINT, vllm_available


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
