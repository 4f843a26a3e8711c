"""The kernel keys on the CPU: `model.use_liger` is refused by name (Liger's kernels are Triton, GPU only; the GPU
checks are tests/e2e/test_liger_gpu.py), `use_prefix_grouper` is refused with the reason (`fused_kernel_options.impl_backend`:
tests/unit/test_triton_head.py)."""
from __future__ import annotations

import pytest
import torch

from conftest import load_config


def test_use_liger_is_refused_on_cpu():
    with pytest.raises(ValueError) as e:
        load_config(["trainer.device=cpu", "actor_rollout_ref.model.use_liger=True", "algorithm.adv_estimator=gae",
                     "critic.ppo_micro_batch_size_per_gpu=2", "critic.model.use_liger=True"])
    msg = str(e.value)
    for key in ("actor_rollout_ref.model.use_liger", "critic.model.use_liger"):
        assert f"{key}=True runs Liger's Triton kernels, which need a GPU, but trainer.device=cpu" in msg, msg


def test_apply_liger_refuses_a_cpu_engine_and_is_a_no_op_when_off():
    from rlx.engine.liger import apply_liger

    model = torch.nn.Linear(2, 2)
    assert apply_liger(model, False, torch.device("cpu"), "critic.model.use_liger") is False
    with pytest.raises(ValueError, match=r"critic.model.use_liger=True runs Liger's Triton kernels, which need a GPU"):
        apply_liger(model, True, torch.device("cpu"), "critic.model.use_liger")


@pytest.mark.parametrize("key, value, reason", [
    ("actor_rollout_ref.actor.use_prefix_grouper", "True", "computes the same log-probs, only with more compute"),
])
def test_kernel_keys_refused_with_the_reason(key, value, reason):
    with pytest.raises(ValueError) as e:
        load_config(["trainer.device=cpu", f"{key}={value}"])
    assert f"{key}=" in str(e.value) and reason in str(e.value), str(e.value)
