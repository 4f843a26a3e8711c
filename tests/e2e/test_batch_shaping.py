"""Batch shaping and the long-response head at the engine level (real FSDP1/FSDP2 over gloo, two ranks):

* remove padding: log-probs, entropy, values and one update's gradients equal the padded path (fp32, 1e-5);
* micro-batch splits (even, uneven, dynamic by token budget): gradients equal the one-micro-batch gradient (1e-6)
  for every loss_agg_mode (verl's five), actor and critic, with activation offload off and on;
* the fused (chunked) head: log-probs, entropy and gradients equal the full-logits head (1e-5), temperature != 1,
  chunks smaller and larger than the response.
"""
from __future__ import annotations
import os
import pytest
import torch
from conftest import free_port as _free_port
from unit.test_batch_shaping import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _worker,
)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_engines_shaping_and_fused_head_exact(strategy):
    os.environ.setdefault("RLX_CACHE", os.path.expanduser("~/.cache/rlx"))
    from rlx.models import resolve_model_path

    resolve_model_path("builtin://tiny-qwen2")  # materialise once, before the ranks race for it
    torch.multiprocessing.spawn(_worker, args=(2, _free_port(), strategy), nprocs=2, join=True)
