"""The generative reward model (`reward_model.judge.enable`): a causal LM that reads a judging prompt per response and
writes a verdict, generated with the rollout engines (`hf` on CPU, `vllm`) inside the reward-model worker; the
number parsed from the verdict is the score (rlx.reward.judge builds the prompts and reads the verdicts). Between
scoring calls the engine sleeps like the rollout's: vLLM's sleep mode (weights to host memory, KV cache freed;
reward_model.rollout.free_cache_engine), the HF model on the CPU.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from rlx.config.schema import RLXConfig, RolloutConfig
from rlx.protocol import Batch
from rlx.reward.judge import judge_prompts, read_verdicts

log = logging.getLogger(__name__)

DEFAULT_LENGTH = 2048  # verl 0.9.1's reward.reward_model.rollout prompt_length and response_length


def judge_lengths(cfg: RLXConfig) -> tuple[int, int]:
    """(prompt, verdict) token budgets: reward_model.rollout.prompt_length / response_length (null: 2048)."""
    r = cfg.reward_model.rollout
    return int(r.prompt_length or DEFAULT_LENGTH), int(r.response_length or DEFAULT_LENGTH)


def judge_tp(cfg: RLXConfig) -> int:
    """The judge's vLLM tensor parallelism (reward_model.rollout.tensor_model_parallel_size; null: 1)."""
    return int(cfg.reward_model.rollout.tensor_model_parallel_size or 1)


def judge_rollout_config(cfg: RLXConfig) -> RolloutConfig:
    """The vLLM engine settings of the judge, from reward_model.rollout.* (null: verl 0.9.1's reward-model serving
    defaults: 0.5 of the GPU, eager, cache freed between calls, chunked prefill, 8192 batched tokens, 1024
    sequences; weights read from reward_model.model.path)."""
    r = cfg.reward_model.rollout
    engine_kwargs = dict(r.engine_kwargs or {})
    if isinstance(engine_kwargs.get("vllm"), dict) or "vllm" in engine_kwargs:
        engine_kwargs = dict(engine_kwargs.get("vllm") or {})
    if r.enable_prefix_caching is not None:
        engine_kwargs.setdefault("enable_prefix_caching", bool(r.enable_prefix_caching))

    def given(value, default):
        return default if value is None else value

    return dataclasses.replace(
        RolloutConfig(), name="vllm", tensor_model_parallel_size=judge_tp(cfg),
        gpu_memory_utilization=given(r.gpu_memory_utilization, 0.5), enforce_eager=given(r.enforce_eager, True),
        free_cache_engine=given(r.free_cache_engine, True), load_format=given(r.load_format, "auto"),
        max_model_len=r.max_model_len, max_num_seqs=given(r.max_num_seqs, 1024),
        max_num_batched_tokens=given(r.max_num_batched_tokens, 8192),
        enable_chunked_prefill=given(r.enable_chunked_prefill, True), disable_log_stats=given(r.disable_log_stats, True),
        engine_kwargs=engine_kwargs, calculate_log_probs=False, ignore_eos=False, n=1)


def _eos_ids(tokenizer, path: str) -> list[int]:
    """The judge's end tokens: its tokenizer's EOS and its generation config's."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    try:
        from transformers import GenerationConfig

        gen = GenerationConfig.from_pretrained(path).eos_token_id
        ids += gen if isinstance(gen, list) else ([gen] if gen is not None else [])
    except OSError:
        pass
    return sorted(set(ids))


class Judge:
    """One rank's judge: its engine, its tokenizer and the actor's (to read the responses)."""

    def __init__(self, cfg: RLXConfig, actor_tokenizer, *, rank: int, world_size: int, device: torch.device,
                 engine: str):
        """`engine`: the judge's engine (the job plan's judge.engine: vllm | hf)."""
        from transformers import AutoTokenizer

        from rlx.models import resolve_model_path
        from rlx.workers.rollout import build_engine

        rm = cfg.reward_model
        self.cfg, self.judge_cfg, self.device = cfg, rm.judge, device
        if rm.model.external_lib:  # registers a custom architecture before the engine loads the judge
            import importlib

            importlib.import_module(rm.model.external_lib)
        self.actor_tokenizer = actor_tokenizer
        assert rm.model.path is not None  # validation refuses a reward model without reward_model.model.path
        path = resolve_model_path(rm.model.path)
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=rm.model.trust_remote_code)
        self.prompt_length, self.response_length = judge_lengths(cfg)
        eos = _eos_ids(self.tokenizer, path)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        self.engine_name = engine
        dtype = rm.rollout.dtype or (cfg.actor_rollout_ref.rollout.dtype if device.type == "cuda" else "float32")
        # between calls vLLM sleeps (reward_model.rollout.free_cache_engine), the HF model goes to the CPU
        self.engine = build_engine(engine, model_path=path, rollout_cfg=judge_rollout_config(cfg),
                                   max_prompt_length=self.prompt_length, max_response_length=self.response_length,
                                   rank=rank, world_size=world_size, pad_token_id=pad, eos_token_id=eos, dtype=dtype,
                                   device=device, trust_remote_code=rm.model.trust_remote_code,
                                   offload_when_released=rm.rollout.free_cache_engine is not False)
        self.pad_token_id, self.calls = pad, 0
        self.sleep()

    # ---- between scoring calls ------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the judge's GPU memory until the next call (vLLM sleep mode; the HF model moved to the CPU); a no-op
        with reward_model.rollout.free_cache_engine=False."""
        self.engine.release()

    def wake_up(self) -> None:
        self.engine.wake_up()

    # ---- scoring --------------------------------------------------------------------------------------
    def prompts(self, batch: Batch) -> tuple[list[list[int]], list[float]]:
        """Each row's judging prompt as the judge's token ids, and 1.0 for each one cut (rlx.reward.judge)."""
        return judge_prompts(batch, self.actor_tokenizer, self.tokenizer, self.judge_cfg, self.prompt_length)

    def generate(self, prompts: list[list[int]]) -> list[list[int]]:
        """The judge's verdict to each prompt, as token ids (its end token dropped)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p, dtype=torch.long), 1
        j = self.judge_cfg
        meta = {"n": 1, "do_sample": j.do_sample, "temperature": j.temperature if j.do_sample else 0.0,
                "top_p": j.top_p, "top_k": j.top_k, "seed": self.cfg.trainer.seed + self.calls}
        self.calls += 1
        self.wake_up()
        try:
            out = self.engine.generate_sequences(Batch({"input_ids": ids, "attention_mask": mask,
                                                        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                                                       meta=meta))
        finally:
            self.sleep()
        return [r[m.bool()].tolist() for r, m in zip(out["responses"], out["response_mask"])]

    def score(self, batch: Batch) -> Batch:
        """Per row: the judge's score, its counts and its verdict (rlx.reward.judge.read_verdicts)."""
        prompts, cut = self.prompts(batch)
        verdict_ids = self.generate(prompts)
        texts = self.tokenizer.batch_decode(verdict_ids, skip_special_tokens=True)
        return read_verdicts(texts, verdict_ids, self.judge_cfg, self.engine.eos_token_id, self.response_length, cut)
