"""Shared plumbing of the actor and critic engines: build + wrap a model, the update skeleton (mini-batches,
micro-batches, exact gradient accumulation, optimizer step), offload phases."""
from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from rlx.algos import core_algos
from rlx.config.schema import CriticModelConfig, FSDPConfig, ModelConfig, OptimConfig
from rlx.protocol import Batch
from rlx.engine import fsdp as F
from rlx.engine.attention import packed_attn_implementation
from rlx.engine.heads import apply_token_head
from rlx.engine.packing import micro_batches, restore_order, token_inputs

log = logging.getLogger("rlx")

FSDP_KEYS = {"actor": "actor_rollout_ref.actor.fsdp_config", "ref": "actor_rollout_ref.ref.fsdp_config",
             "critic": "critic.model.fsdp_config",
             "reward": "reward_model.model.fsdp_config"}  # each role's fsdp_config, as errors name it
MODEL_KEYS = {"actor": "actor_rollout_ref.model", "ref": "actor_rollout_ref.model", "critic": "critic.model",
              "reward": "reward_model.model"}


class FSDPEngine:
    """An FSDP-wrapped HF model with (optionally) an optimizer, activation offload and CPU offload.

    Runs without Ray: workers and torchrun scripts construct it the same way. `role` is actor | ref | critic |
    reward (the reward model: the critic's one-label head, no optimizer).
    """

    def __init__(self, *, role: str, model_cfg: ModelConfig | CriticModelConfig, strategy: str, fsdp_cfg: FSDPConfig,
                 device: torch.device, optim_cfg: OptimConfig | None = None, total_steps: int = 1,
                 dtype: str | None = None, head_chunk_size: Optional[int] = None, sp_size: int = 1,
                 sp_key: str = "ulysses_sequence_parallel_size", max_micro_batch_tokens: Optional[int] = None,
                 entropy_chunk_size: Optional[int] = None, entropy_checkpointing: bool = False,
                 head_backend: str = "torch", freeze_vision_tower: bool = False):
        self.role, self.device, self.fsdp_cfg = role, device, fsdp_cfg
        self.remove_padding = model_cfg.use_remove_padding
        dtype = dtype or fsdp_cfg.model_dtype
        # Ulysses: groups of sp ranks share a micro-batch, each holds 1/sp of its packed row (see `ulysses`)
        self.sp = sp_size
        self.sp_group = self.sp_rank = None
        if sp_size > 1:
            from rlx.engine import ulysses

            if not self.remove_padding:
                raise ValueError(f"{sp_key}={sp_size} shards the packed (remove-padding) sequence; set "
                                 f"use_remove_padding=True on this role's model, or {sp_key}=1.")
            self.sp_group = ulysses.sp_group(sp_size)
            self.sp_rank = dist.get_rank(self.sp_group)
            ulysses.register_ulysses_attention()
        attn = ulysses.ULYSSES_ATTENTION if sp_size > 1 else \
            packed_attn_implementation(device.type) if self.remove_padding else "sdpa"
        from rlx.models import local_model_path

        # model.use_shm: loaded from a copy in /dev/shm (made once per host)
        path = local_model_path(model_cfg.path, model_cfg.use_shm,
                                "critic.model.use_shm" if role == "critic" else "actor_rollout_ref.model.use_shm")
        scorer = role in ("critic", "reward")  # a one-label head on every token: values, or the reward model's score
        model = F.build_hf_model(path, "critic" if scorer else "actor", F.DTYPES[dtype],
                                 override_config=model_cfg.override_config,
                                 trust_remote_code=model_cfg.trust_remote_code,
                                 external_lib=model_cfg.external_lib, attn_implementation=attn)
        self.num_layers = model.config.num_hidden_layers
        # Liger's kernels first: LoRA, the tiled MLP and layers, the offload then call its module forwards
        from rlx.engine.liger import apply_liger

        self.liger = apply_liger(model, model_cfg.use_liger, device, f"{MODEL_KEYS[role]}.use_liger")
        self.lora = None  # LoRA (peft) on the plain HF model, first: the head, tiling and FSDP see its modules
        from rlx.engine.lora import lora_enabled

        if lora_enabled(model_cfg):
            from rlx.engine.lora import apply_lora

            if strategy == "fsdp" and any(p.dtype != torch.float32 for p in model.parameters()):
                raise ValueError(f"lora_rank={model_cfg.lora_rank} with strategy=fsdp and fsdp_config.model_dtype="
                                 f"{dtype}: FSDP1 flattens a layer's frozen base and its fp32 adapters into one "
                                 f"buffer of one dtype; use strategy=fsdp2, or model_dtype=fp32")
            self.lora = apply_lora(model, model_cfg)
        from rlx.engine.architecture import describe

        self.architecture = describe(model, self.lora)  # what a checkpoint of this engine says it holds
        if freeze_vision_tower:  # after LoRA, as verl: adapters placed inside the tower are frozen with it
            from rlx.engine.vision import apply_freeze_vision_tower

            apply_freeze_vision_tower(model, True, dist.get_rank() if dist.is_initialized() else 0)
        if sp_size > 1:
            ulysses.check_heads(model.config, sp_size, sp_key)
            ulysses.apply_ulysses(model, self.sp_group)
        # the head only where a response token is scored; chunked (never [tokens, vocab]) with head_chunk_size
        apply_token_head(model, role, head_chunk_size, entropy_chunk_size=entropy_chunk_size,
                         entropy_checkpointing=entropy_checkpointing, backend=head_backend)
        from rlx.offload import find_decoder_layers

        if model_cfg.tile_mlp_tokens > 0:
            from rlx.ops.tiled_mlp import apply_tiled_mlp

            apply_tiled_mlp(find_decoder_layers(model), model_cfg.tile_mlp_tokens)
        tiled = []  # decoder layers that recompute themselves in backward (their own checkpoint)
        if model_cfg.tile_layer_tokens > 0:
            from rlx.ops.tiled_layer import apply_tiled_layers

            tiled = apply_tiled_layers(find_decoder_layers(model), model_cfg.tile_layer_tokens,
                                       final_norm=getattr(model.base_model, "norm", None)).layers
        trains = optim_cfg is not None
        offload = trains and model_cfg.enable_activation_offload
        ckpt = trains and model_cfg.enable_gradient_checkpointing
        if ckpt and not offload and not tiled:
            F.apply_gradient_checkpointing(model)
        with warnings.catch_warnings():
            if self.lora is not None and strategy == "fsdp":  # said once here instead of once per layer
                warnings.filterwarnings("ignore", message=".*has both parameters with requires_grad=True and False")
                log.info("[%s] LoRA with strategy=fsdp: FSDP1 keeps one flat gradient per layer, frozen weights "
                         "included (full-size gradient memory); strategy=fsdp2 holds the adapters' only", role)
            self.module = F.apply_fsdp(model, strategy, fsdp_cfg, device, key=FSDP_KEYS[role])
        self.offloader, self._offload_reported = None, False
        if offload:
            # The offload module owns checkpointing when both are on (one saved-tensors hook at a time).
            from rlx.offload import apply_activation_offload

            self.offloader = apply_activation_offload(self.module, model_cfg.activation_offload,
                                                      enable_gradient_checkpointing=ckpt, recomputed=tiled)
            if max_micro_batch_tokens:  # the pool's size up front: no growth on the first long step
                mp_dtype = fsdp_cfg.mixed_precision.get("param_dtype")
                reserved = self.offloader.reserve_pool(max_micro_batch_tokens, model.config.hidden_size,
                                                       F.DTYPES[mp_dtype] if mp_dtype else F.DTYPES[dtype])
                if reserved:
                    log.info("[%s] host pool reserved for %d tokens per micro-batch: %.2f GiB", role,
                             max_micro_batch_tokens, reserved / 2**30)
            log.info("[%s] %s", role, self.offloader.describe())
        self.optimizer = self.lr_scheduler = None
        if optim_cfg is not None:  # trains
            self.optimizer, self.lr_scheduler = F.build_optimizer(self.module, optim_cfg, total_steps)
        self._params_on_device = True
        if fsdp_cfg.param_offload:
            self.offload_params()
        if trains and fsdp_cfg.optimizer_offload:
            self._move_optimizer_state(torch.device("cpu"))

    def _move_optimizer_state(self, device: torch.device) -> None:
        assert self.optimizer is not None  # called for a role that trains
        F.move_optimizer_state(self.optimizer, device)

    # ---- phases --------------------------------------------------------------------------------------
    def offload_params(self):
        if self.device.type == "cuda" and self._params_on_device:
            F.move_params(self.module, torch.device("cpu"))
            self._params_on_device = False

    def load_params(self):
        if self.device.type == "cuda" and not self._params_on_device:
            F.move_params(self.module, self.device)
            self._params_on_device = True

    @contextlib.contextmanager
    def phase(self, with_optimizer: bool = False):
        """Bring offloaded params (and optimizer state) to the device for one phase, then put them back."""
        self.load_params()
        if with_optimizer and self.fsdp_cfg.optimizer_offload:
            self._move_optimizer_state(self.device)
        try:
            yield
        finally:
            if with_optimizer and self.fsdp_cfg.optimizer_offload:
                self._move_optimizer_state(torch.device("cpu"))
            if self.fsdp_cfg.param_offload:
                self.offload_params()

    @contextlib.contextmanager
    def optimizer_state_from_first_step(self):
        """Within an update, with `optimizer_offload`: the optimizer state stays on the CPU through the first
        mini-batch's forward and backward and comes to the device for the first optimizer step, staying there until
        the update ends (one copy each way per update, as for a whole phase). With one mini-batch per update (long
        responses) the activations and the optimizer state are never on the device together. Yields `ready()`, to
        call before each optimizer step."""
        moved = False

        def ready():
            nonlocal moved
            if self.fsdp_cfg.optimizer_offload and not moved:
                self._move_optimizer_state(self.device)
                moved = True

        try:
            yield ready
        finally:
            if moved:
                self._move_optimizer_state(torch.device("cpu"))

    def offload_metrics(self, phase: str) -> dict:
        """What the activation offload moved in the last micro-batch and how big its host pool is."""
        if self.offloader is None:
            return {}
        if not self._offload_reported:  # one line with what the first update actually offloaded
            log.info("[%s] after the first update: %s", self.role, self.offloader.describe())
            self._offload_reported = True
        st = self.offloader.stats()
        return {f"perf/{phase}/offloaded_activation_gb": st["offloaded_bytes_last_step"] / 2**30,
                f"perf/{phase}/offload_pool_gb": st["pool_bytes"] / 2**30}

    def micro_batch_context(self):
        """Around one training micro-batch's forward+backward: activation offload if enabled."""
        return self.offloader.activate() if self.offloader is not None else contextlib.nullcontext()

    # ---- forward -----------------------------------------------------------------------------------
    def forward_tokens(self, mb: Batch, **head_kwargs):
        """The head's outputs for `mb`'s response tokens as `[rows, R]` tensors (zeros at response padding):
        `(log_probs, entropy | None)` for actor/ref (pass temperature, with_entropy), `values` for the critic."""
        ti = token_inputs(mb, self.device, self.remove_padding,
                          sp=(self.sp_rank, self.sp) if self.sp_rank is not None else None)  # set when sp > 1
        out = self.module(**ti.kwargs, **head_kwargs)
        if isinstance(out, tuple):
            return tuple(None if o is None else ti.scatter(o) for o in out)
        return ti.scatter(out)

    def _group_tokens(self, max_tokens: Optional[int]) -> Optional[int]:
        """The token budget of one micro-batch of a sequence-parallel group: `*_max_token_len_per_gpu` x sp (verl),
        since each of its sp ranks holds 1/sp of the tokens."""
        return None if max_tokens is None else max_tokens * self.sp

    def agree_max(self, n: int) -> int:
        """The max of `n` over this engine's data-parallel ranks (every rank must run as many micro-batches)."""
        return int(self._all_reduce(n, dist.ReduceOp.MAX))

    def _all_reduce(self, x: float, op=dist.ReduceOp.SUM) -> float:
        """`x` reduced over this engine's data-parallel ranks (itself without a process group)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return float(t.item())

    @torch.no_grad()
    def forward_batch(self, batch: Batch, micro_size: Optional[int], max_tokens: Optional[int],
                      fn: Callable[[Batch], dict]) -> Batch:
        """Eval-mode, no-grad forward of `batch` in micro-batches (by count, or by token budget with
        `max_tokens`); `fn(mb) -> {name: [rows, ...] tensor}`; rows come back in the batch's order."""
        self.train_mode(False)
        outs = []
        with self.phase():
            mbs, perm = micro_batches(batch, micro_size, self._group_tokens(max_tokens), agree=self.agree_max)
            for mb in mbs:
                outs.append(Batch({k: v.cpu() for k, v in fn(mb).items()}))
        return restore_order(Batch.concat(outs), perm)

    def run_update(self, batch: Batch, spec: "UpdateSpec", loss_fn) -> dict:
        """The update skeleton shared by actor and critic: for each PPO epoch and mini-batch, micro-batches (by
        count or token budget) run forward + backward inside the offload context; their losses are scaled so
        that the accumulated gradient is the whole mini-batch's (`core_algos.agg_loss` with the mini-batch's
        counts over data-parallel ranks, `core_algos.GlobalBatchInfo`), whatever the split; then one clipped
        optimizer step.

        `loss_fn(mb, global_batch) -> (loss, shares, means)`: `shares` are loss terms scaled like `loss` (summed per
        mini-batch, which gives the mini-batch's value), `means` per-micro-batch statistics. Returns the
        metrics averaged over mini-batches / micro-batches."""
        assert self.lr_scheduler is not None  # an update: a role that trains
        self.train_mode(True)
        metrics: dict[str, list[float]] = {}

        def add(k, v):
            metrics.setdefault(k, []).append(float(v))

        world = dist.get_world_size() if dist.is_initialized() else 1
        with self.phase(), self.optimizer_state_from_first_step() as optimizer_ready:
            for mini in split_minis(batch, spec.mini_size, spec.epochs, spec.shuffle, spec.seed):
                mbs, _ = micro_batches(mini, spec.micro_size, self._group_tokens(spec.max_tokens),
                                       agree=self.agree_max)
                tokens = sum(int(mb["response_mask"].bool().sum()) for mb in mbs)
                rows = sum(len(mb) for mb in mbs)
                # FSDP averages gradients over ranks, so each rank's loss is multiplied by the world size; the sp
                # ranks of a sequence-parallel group hold the same rows: their tokens and rows count once
                global_batch = core_algos.GlobalBatchInfo(
                    dp_size=world, batch_num_tokens=self._all_reduce(tokens) / self.sp,
                    global_batch_size=self._all_reduce(rows) / self.sp, loss_scale_factor=spec.loss_scale_factor)
                summed: dict[str, float] = {}  # the loss terms of this mini-batch
                for mb in mbs:
                    with self.micro_batch_context():
                        loss, shares, means = loss_fn(mb, global_batch)
                        loss.backward()
                    if self.lora is not None:
                        F.restore_frozen_views(self.module)
                    for k, v in shares.items():  # the sp ranks of a group report the group's loss sp times
                        summed[k] = summed.get(k, 0.0) + float(v) / self.sp
                    for k, v in means.items():
                        add(k, v)
                for k, v in summed.items():
                    add(k, v)
                optimizer_ready()
                for k, v in self.optimizer_step(spec.grad_clip).items():
                    add(f"{spec.prefix}/{k}", v)
            self.lr_scheduler.step()
        out = {k: sum(v) / len(v) for k, v in metrics.items()}
        out[f"{spec.prefix}/skipped_steps"] = sum(metrics[f"{spec.prefix}/skipped_steps"])  # a count, not a mean
        out[f"{spec.prefix}/lr"] = self.lr_scheduler.get_last_lr()[0]
        out.update(device_memory_metrics(self.device, f"update_{spec.prefix}"))
        out.update(self.offload_metrics(f"update_{spec.prefix}"))
        return out

    def optimizer_step(self, grad_clip: float) -> dict:
        """Clip and step; a non-finite gradient norm skips the step (`skipped_steps` counts it for the driver)."""
        assert self.optimizer is not None  # an update: a role that trains
        grad_norm = F.clip_grad_norm(self.module, grad_clip)
        finite = bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
        else:
            log.warning("[%s] non-finite grad norm %s: optimizer step skipped", self.role, grad_norm.item())
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": float(grad_norm), "skipped_steps": 0.0 if finite else 1.0}

    def train_mode(self, training: bool):
        self.module.train(training)

    # ---- LoRA ----------------------------------------------------------------------------------------
    def adapters_disabled(self):
        """The base model (adapters off) for the duration of the context; a no-op without LoRA."""
        if self.lora is None:
            return contextlib.nullcontext()
        from rlx.engine.lora import adapters_disabled

        return adapters_disabled(self.module)

    def policy_weights(self, **kwargs):
        """`(hf_name, full tensor)` of the policy as a plain HF model (collective, see `iter_full_params`, whose
        keyword arguments it takes: `layered=True` unshards one FSDP unit at a time): with LoRA the adapted
        projections come merged (`W + s B A`), under the plain model's names, one projection at a time as its
        unit is gathered."""
        from rlx.engine.weights import iter_full_params

        named = iter_full_params(self.module, **kwargs)
        if self.lora is None:
            return named
        from rlx.engine.lora import merged_params

        return merged_params(named, self.lora.scaling)


@dataclass
class UpdateSpec:
    """How one role's update splits its batch (verl's keys, resolved per rank)."""

    prefix: str
    """Metric prefix: actor | critic."""
    mini_size: int
    """Rows per mini-batch (one optimizer step) on this rank."""
    micro_size: Optional[int]
    """Rows per micro-batch (the last may be smaller); unused with max_tokens."""
    max_tokens: Optional[int]
    """Token budget per micro-batch (dynamic batch size), or None."""
    epochs: int
    """PPO epochs over the batch."""
    shuffle: bool
    """Shuffle rows between epochs."""
    seed: int
    """Seed of that shuffle."""
    grad_clip: float
    """Max gradient norm."""
    loss_scale_factor: Optional[float] = None
    """The divisor of seq-mean-token-sum-norm (None: the padded response length)."""


def micro_batch_tokens(prompt_length: int, response_length: int, micro_size: Optional[int],
                       max_tokens: Optional[int]) -> int:
    """The most tokens one training micro-batch can hold under the config: the dynamic-batch token budget, or
    micro-batch rows x (data.max_prompt_length + data.max_response_length)."""
    if max_tokens:
        return int(max_tokens)
    return int(micro_size or 1) * (int(prompt_length) + int(response_length))


def role_micro_batch_tokens(data_cfg, role_cfg) -> int:
    """`micro_batch_tokens` for one training role (`actor_rollout_ref.actor` or `critic`): its micro-batch rows,
    or its token budget when `use_dynamic_bsz` is on, over the data's prompt + response lengths."""
    return micro_batch_tokens(data_cfg.max_prompt_length, data_cfg.max_response_length,
                              role_cfg.ppo_micro_batch_size_per_gpu,
                              role_cfg.ppo_max_token_len_per_gpu if role_cfg.use_dynamic_bsz else None)


def split_minis(batch: Batch, mini_size: int, epochs: int, shuffle: bool, seed: int):
    """Yield the mini-batches of each PPO epoch (rows shuffled per epoch with `shuffle`)."""
    for epoch in range(epochs):
        data = batch
        if shuffle:
            g = torch.Generator().manual_seed(seed + epoch)
            data = batch.index(torch.randperm(len(batch), generator=g))
        yield from data.split(mini_size)


def device_memory_metrics(device: torch.device, phase: str) -> dict:
    """Peak memory of this phase: device allocator on CUDA (peak reset after reading), host RSS on CPU."""
    import psutil

    rss = psutil.Process().memory_info().rss / 2**30
    out = {f"perf/{phase}/cpu_memory_used_gb": rss}
    if device.type == "cuda":
        out[f"perf/{phase}/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        out[f"perf/{phase}/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    else:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        out[f"perf/{phase}/max_memory_allocated_gb"] = out[f"perf/{phase}/max_memory_reserved_gb"] = peak
    return out
