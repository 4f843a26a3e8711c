"""End-to-end half of tests/unit/test_ulysses.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import pytest
import torch
from unit.test_ulysses import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    DYN,
    LAYER,
    LONG,
    LORA,
    _bf16_logprob_worker,
    _exactness_worker,
    _memory_worker,
    _spawn,
    bf16_noise_check,
)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_sp2_matches_sp1(strategy):
    """FSDP1: HF checkpointing alone (its recompute runs the all-to-alls again), then offload + checkpointing +
    tiled decoder layers + fused head; FSDP2: nothing on, then LoRA on the actor with offload + checkpointing +
    tiled decoder layers + fused head. Both: offload + checkpointing + tiled MLP + fused head + dynamic batch
    size."""
    if strategy == "fsdp":
        first = [("hf-ckpt", ["actor_rollout_ref.model.enable_gradient_checkpointing=True"], None),
                 ("offload+ckpt+layer+fused", LAYER, None)]
    else:
        first = [("plain", [], None), ("lora+offload+ckpt+layer+fused", LORA + LAYER, None)]
    _spawn(_exactness_worker, 2, strategy, (2,), first + [("offload+ckpt+tile+fused+dyn", LONG + DYN, 20)])


def test_sp4_gqa_repeats_kv_heads():
    """4 ranks: sp=4 (2 KV heads repeated) and sp=2 against sp=1, with offload, the tiled decoder layers (the
    tiled layer's recompute runs the all-to-alls again, all heads in one call) and the fused head."""
    _spawn(_exactness_worker, 4, "fsdp2", (2, 4), [("offload+ckpt+layer+fused", LAYER, None)])


def test_sp2_halves_saved_activations_per_rank(tmp_path):
    """The activations the offload saw saved by the decoder layers (parameters excluded by storage), per rank,
    for the same 466-token micro-batch: SP=2 about half of SP=1 (each rank holds 233 tokens)."""
    out = str(tmp_path / "mem.pt")
    _spawn(_memory_worker, 2, out)
    got = torch.load(out, weights_only=True)
    ratio = got[2] / got[1]
    print(f"saved activation bytes per rank: sp=1 {got[1] / 2**20:.2f} MiB, sp=2 {got[2] / 2**20:.2f} MiB, "
          f"ratio {ratio:.3f}")
    assert got[1] > 2**20 and 0.45 <= ratio <= 0.55, got


@pytest.mark.gpu
def test_sp2_matches_sp1_on_two_gpus():
    """The same exactness check on 2 GPUs over NCCL (fp32, FSDP2, offload + checkpointing + tiled MLP or tiled
    decoder layers + fused head); needs 2 visible GPUs."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    _spawn(_exactness_worker, 2, "fsdp2", (2,), [("offload+ckpt+tile+fused+dyn", LONG + DYN, 20),
                                                 ("offload+ckpt+layer+fused", LAYER, None)], "cuda")


@pytest.mark.gpu
def test_sp2_logprobs_match_sp1_at_bf16_noise_on_two_gpus(tmp_path):
    """bf16 mixed precision (as GPU jobs run), 2 GPUs over NCCL: the actor's log-probs of the same batch under SP=2
    are as close to the fp32 values as SP=1's (see bf16_noise_check); needs 2 visible GPUs."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    out = str(tmp_path / "lp.pt")
    _spawn(_bf16_logprob_worker, 2, "cuda", out)
    print("\n" + bf16_noise_check(torch.load(out, weights_only=True)))
