"""Rollouts: `hf` (an HF model copy in the worker, synced from FSDP, sampled with a KV cache) and `vllm` (an
in-process vLLM engine per rank).

`build_rollout("vllm" | "hf", **kwargs)` imports the chosen implementation lazily, so importing this package
never pulls in vLLM. `build_engine(engine, ...)` builds the engine a job plan names (rlx.plan) from the arguments
both share. This module is where what differs between the engines is decided by their name (with rlx.plan, which
resolves the name): nothing else compares engine names.
"""
from __future__ import annotations

import itertools

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
                 dtype: str, device, trust_remote_code: bool, offload_when_released: bool = False,
                 dp_rank: int | None = None):
    """The generation engine `engine` (vllm | hf, as a job plan names it) over `model_path` on `device` (a
    torch.device), with what each takes: vLLM reads `rollout_cfg`'s engine settings (sleep mode, tensor
    parallelism, ...), hf its calculate_log_probs and ignore_eos. `dtype`: a torch dtype's name. With
    `offload_when_released` the hf model moves to the CPU between calls on a GPU (vLLM sleeps by
    rollout_cfg.free_cache_engine). `dp_rank`: the vLLM engine's data-parallel replica (its seeds), when it is not
    rank // tensor parallelism (an engine in a process group of its own)."""
    if engine == "vllm":
        return build_rollout("vllm", model_path=model_path, rollout_cfg=rollout_cfg,
                             max_prompt_length=max_prompt_length, max_response_length=max_response_length,
                             rank=rank, world_size=world_size, pad_token_id=pad_token_id,
                             eos_token_id=eos_token_id, dtype=dtype, device=device.type,
                             trust_remote_code=trust_remote_code, dp_rank=dp_rank)
    import torch

    extra = {"offload_when_released": True} if offload_when_released and device.type == "cuda" else {}
    return build_rollout("hf", model_path=model_path, max_response_length=max_response_length,
                         pad_token_id=pad_token_id, eos_token_id=eos_token_id, device=device,
                         dtype=getattr(torch, dtype), calculate_log_probs=rollout_cfg.calculate_log_probs,
                         trust_remote_code=trust_remote_code, ignore_eos=rollout_cfg.ignore_eos, **extra)


def build_tokenizer(cfg):
    """The policy's tokenizer (from /dev/shm too with model.use_shm), with model.custom_chat_template."""
    from transformers import AutoTokenizer

    from rlx.models import local_model_path

    model = cfg.actor_rollout_ref.model
    tok = AutoTokenizer.from_pretrained(local_model_path(model.path, model.use_shm),
                                        trust_remote_code=model.trust_remote_code)
    if model.custom_chat_template:  # carried by the HF export of the checkpoints
        tok.chat_template = model.custom_chat_template
    return tok


def build_rank_engine(cfg, engine: str, device, rank: int, world_size: int, rollout_cfg: RolloutConfig | None = None,
                      dp_rank: int | None = None):
    """The rollout engine of one worker rank (`engine`: the plan's, vllm | hf) over the policy model, and the
    tokenizer. `rollout_cfg`: actor_rollout_ref.rollout, or a variant of it (the disaggregated rollout's); `rank`
    and `world_size`: in the process group the engine lives in; `dp_rank`: see build_engine."""
    from rlx.models import local_model_path

    arr, data = cfg.actor_rollout_ref, cfg.data
    path = local_model_path(arr.model.path, arr.model.use_shm)  # the engine and tokenizer: from /dev/shm too
    tok = build_tokenizer(cfg)
    dtype = arr.rollout.dtype if device.type == "cuda" else "float32"
    rollout = build_engine(engine, model_path=path, rollout_cfg=rollout_cfg or arr.rollout,
                           max_prompt_length=data.max_prompt_length, max_response_length=data.max_response_length,
                           rank=rank, world_size=world_size, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id, dtype=dtype, device=device,
                           trust_remote_code=arr.model.trust_remote_code, dp_rank=dp_rank)
    return rollout, tok


def build_agent_rollout(cfg, plan, rollout, tokenizer):
    """The agent loop over a rank's engine `rollout` when the plan's rollout runs one (rollout.mode=async or
    multi_turn.enable), else None: in the actor's worker (colocated) or in a rollout worker (its own pool)."""
    if not plan.rollout.agent_loop:
        return None
    from rlx.workers.rollout.agent.runner import AgentRollout

    arr, data = cfg.actor_rollout_ref, cfg.data
    return AgentRollout(rollout, plan.rollout.engine, tokenizer, arr.rollout, max_prompt_length=data.max_prompt_length,
                        max_response_length=data.max_response_length, pad_token_id=tokenizer.pad_token_id)


def generate_row_groups(engine: str, rollout, groups: list[tuple]) -> list[list[tuple[list[int], list[float] | None]]]:
    """Continue each prompt of several groups `(prompts, budgets, meta, rows)` (each group its own sampling settings
    and seed) by at most its budget of tokens, on `engine`: per group, per row the generated ids (up to and including
    an EOS) and their log-probs (None without rollout.calculate_log_probs). A prompt is token ids of any length;
    `rows` gives each request's row in its batch (its sampling seed, as the sync path gives that sample). vLLM takes
    every group's requests in one call, so they share its batches; hf runs the groups one after the other."""
    if engine == "vllm":
        from vllm.inputs import TokensPrompt

        from rlx.workers.rollout import vllm_compat

        prompts, params, sizes = [], [], []
        for group_prompts, budgets, meta, rows in groups:
            prompts += [TokensPrompt(prompt_token_ids=list(p)) for p in group_prompts]
            params += [rollout.request_params(meta, b, r) for b, r in zip(budgets, rows)]
            sizes.append(len(group_prompts))
        if rollout.calculate_log_probs:
            for p in params:
                p.logprobs = 0
        outs = rollout.llm.generate(prompts, params, use_tqdm=False) if prompts else []
        result = []
        for out in outs:
            s = out.outputs[0]
            ids = list(s.token_ids)
            lps = vllm_compat.sampled_logprobs(s, ids) if s.logprobs else None
            result.append((ids, lps))
        ends = list(itertools.accumulate(sizes))
        return [result[end - n:end] for end, n in zip(ends, sizes)]
    import torch

    results = []
    for group_prompts, budgets, meta, _ in groups:
        gen = torch.Generator(device=rollout.device).manual_seed(int(meta.get("seed", 0)))
        out = rollout.generate_ids(group_prompts, budgets, meta, gen)
        results.append([(ids, lps if rollout.calculate_log_probs else None) for ids, lps in out])
    return results


def build_stream(engine: str, rollout):
    """Partial rollout's responses kept live in the engine between segments (`VLLMStream`, continuous batching) on
    vLLM; None on hf, whose segments are generate calls (`generate_row_groups`)."""
    if engine != "vllm":
        return None
    from rlx.workers.rollout.stream import VLLMStream

    return VLLMStream(rollout)


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
