"""Configuration of layer-grouped activation offload (`rlx.offload`, see docs/offload.md): a plain dataclass,
here so that the typed config depends on nothing above it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class ActivationOffloadConfig:
    """Knobs of `apply_activation_offload`. The on/off switch is `model.enable_activation_offload`."""

    min_tensor_bytes: int = 1 << 20
    """Saved tensors whose storage is smaller than this stay on the device (not worth a copy)."""

    keep_last_layers: Optional[int] = None
    """The saved activations of this many last decoder layers stay on the device: backward needs them first,
    so copying them out and straight back would only cost time. 0 offloads every layer (lowest peak).
    None: 0 with checkpointing (only layer inputs are saved, tiny copies), 1 without."""

    pin_memory: bool = True
    """Use page-locked host memory for the pool (CUDA only; needed for asynchronous copies at full speed)."""

    pool_chunk_bytes: int = 256 << 20
    """The host pool grows in chunks of at least this many bytes; chunks are reused across layers,
    micro-batches and steps, so steady state does no host allocation."""

    max_pool_bytes: Optional[int] = None
    """Upper bound on the host pool. When a copy would need more, that tensor stays on the device instead.
    None: no bound (the pool grows to one micro-batch's offloaded activations and then stops)."""

    reserve_pool: bool = True
    """With checkpointing (where each offloaded group is one layer input), size the host pool before the first
    update for the longest micro-batch the config allows (data.max_prompt_length + data.max_response_length
    times ppo_micro_batch_size_per_gpu, or ppo_max_token_len_per_gpu with use_dynamic_bsz), instead of growing
    it on the first step at each longer length (~0.4 s per new GiB of pinned memory). False: grow on demand."""

    offload_head: bool = True
    """Also treat the final norm and the output projection (HF `get_output_embeddings()`) as groups, so their
    saved inputs (a few hidden-state copies) leave the device while the vocabulary-sized loss runs, where the
    peak usually is. Their copies out overlap the output projection; the copy back of its input (one hidden
    state) is the only one at the start of backward that nothing hides."""

    prefetch_layers: int = 2
    """During backward, how many offloaded groups ahead of the layer being differentiated are copied back
    (backward memory is usually far below the loss peak, so 2 costs no peak). With tile_layer_tokens on long
    sequences each group costs one hidden vector per token at the peak and a layer's backward is long enough to
    hide a copy: use 1."""

    rebuild_pointwise: bool = True
    """A saved tensor that is the whole output of an elementwise `silu` or `mul` of other offloaded tensors of
    the same layer (the gated MLP's activation and product) is not copied: on the way back it is rebuilt from
    them by the same kernel, bit for bit, on the copy stream. No matmul or attention is recomputed; about a
    third fewer bytes cross PCIe on a SwiGLU model. False copies these tensors like any other."""

    recompute_mlp: bool = False
    """Without checkpointing only: recompute each decoder layer's MLP (`layer.mlp`) in backward instead of
    offloading its intermediates; only the MLP input is offloaded. A different trade-off from plain offload
    (about 1/3 of the bytes moved, one MLP forward recomputed per layer)."""
