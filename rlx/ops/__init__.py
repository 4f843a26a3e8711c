"""Memory-saving compute ops for the training engine (torch; CPU and CUDA alike; one optional Triton backend).

- `log_probs_from_hidden`: the LM head's per-token log-probs (and entropy) computed in token chunks, never
  materialising the `[tokens, vocab]` logits or their gradient; the per-chunk math in torch, or in Triton kernels
  (`triton_head`, imported only when asked for).
- `apply_tiled_mlp`: each decoder layer's MLP runs in tiles of tokens in forward and backward, so its
  `[tokens, intermediate_size]` activations exist for one tile at a time.
- `apply_tiled_layers`: every token-local part of each decoder layer (norms, projections, rotary, residuals,
  MLP) runs in tiles of tokens, the layer saving only its input (its own checkpoint); only attention is whole.
"""
from __future__ import annotations

from .log_prob_head import log_probs_from_hidden
from .tiled_layer import TiledLayerHandle, apply_tiled_layers
from .tiled_mlp import TiledMLPHandle, apply_tiled_mlp

__all__ = ["TiledLayerHandle", "TiledMLPHandle", "apply_tiled_layers", "apply_tiled_mlp", "log_probs_from_hidden"]
