"""Shared plumbing of the actor and critic engines: build + wrap a model, micro-batch loop, offload phases."""
from __future__ import annotations

import contextlib
import logging

import torch

from rlx.protocol import Batch
from rlx.workers.engine import fsdp as F

log = logging.getLogger("rlx")


class FSDPEngine:
    """An FSDP-wrapped HF model with (optionally) an optimizer, activation offload and CPU offload.

    Runs without Ray: workers and torchrun scripts construct it the same way. `role` is actor | ref | critic.
    """

    def __init__(self, *, role: str, model_cfg, strategy: str, fsdp_cfg, device: torch.device,
                 optim_cfg=None, total_steps: int = 1, dtype: str | None = None):
        self.role, self.device, self.fsdp_cfg = role, device, fsdp_cfg
        dtype = dtype or fsdp_cfg.model_dtype
        model = F.build_hf_model(model_cfg.path, "critic" if role == "critic" else "actor", F.DTYPES[dtype],
                                 override_config=model_cfg.override_config,
                                 trust_remote_code=model_cfg.trust_remote_code,
                                 external_lib=getattr(model_cfg, "external_lib", None))
        self.num_layers = model.config.num_hidden_layers
        trains = optim_cfg is not None
        offload = trains and bool(getattr(model_cfg, "enable_activation_offload", False))
        ckpt = trains and model_cfg.enable_gradient_checkpointing
        if ckpt and not offload:
            F.apply_gradient_checkpointing(model)
        self.module = F.apply_fsdp(model, strategy, fsdp_cfg, device)
        self.offloader, self._offload_reported = None, False
        if offload:
            # The offload module owns checkpointing when both are on (one saved-tensors hook at a time).
            from rlx.offload import apply_activation_offload

            self.offloader = apply_activation_offload(self.module, model_cfg.activation_offload,
                                                      enable_gradient_checkpointing=ckpt)
            log.info("[%s] %s", role, self.offloader.describe())
        self.optimizer = self.lr_scheduler = None
        if trains:
            self.optimizer, self.lr_scheduler = F.build_optimizer(self.module, optim_cfg, total_steps)
        self._params_on_device = True
        if fsdp_cfg.param_offload:
            self.offload_params()
        if trains and fsdp_cfg.optimizer_offload:
            F.move_optimizer_state(self.optimizer, torch.device("cpu"))

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
            F.move_optimizer_state(self.optimizer, self.device)
        try:
            yield
        finally:
            if with_optimizer and self.fsdp_cfg.optimizer_offload:
                F.move_optimizer_state(self.optimizer, torch.device("cpu"))
            if self.fsdp_cfg.param_offload:
                self.offload_params()

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
    def forward_logits(self, mb: Batch) -> torch.Tensor:
        out = self.module(input_ids=mb["input_ids"].to(self.device),
                          attention_mask=mb["attention_mask"].to(self.device),
                          position_ids=mb["position_ids"].to(self.device), use_cache=False)
        return out.logits

    def optimizer_step(self, grad_clip: float) -> dict:
        grad_norm = F.clip_grad_norm(self.module, grad_clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            log.warning("[%s] non-finite grad norm %s: optimizer step skipped", self.role, grad_norm.item())
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": float(grad_norm)}

    def train_mode(self, training: bool):
        self.module.train(training)


def split_mini_micro(batch: Batch, mini_size: int, micro_size: int, epochs: int, shuffle: bool, seed: int):
    """Yield (mini-batch index, list of micro-batches) for each PPO epoch and mini-batch."""
    for epoch in range(epochs):
        data = batch
        if shuffle:
            g = torch.Generator().manual_seed(seed + epoch)
            data = batch.index(torch.randperm(len(batch), generator=g))
        for i, mini in enumerate(data.split(mini_size)):
            yield i, mini.split(micro_size)


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
