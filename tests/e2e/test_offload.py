"""End-to-end half of tests/unit/test_offload.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import gc
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
import pytest
import torch
from rlx.offload import ActivationOffloadConfig, apply_activation_offload
from conftest import free_port as _free_port
from unit.test_offload import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    BOUND_1MIB,
    CFG0,
    DEFAULTS,
    _assert_steps_equal,
    _eq,
    _fsdp_cases_worker,
    _fsdp_worker,
    _step,
    assert_same,
    batches,
    lm_loss,
    tiny_qwen2,
    train,
)


@pytest.mark.parametrize("strategy", ["fsdp1", "fsdp2"])
def test_fsdp_gradients_bitwise(strategy):
    torch.multiprocessing.spawn(_fsdp_worker, args=(2, _free_port(), strategy), nprocs=2, join=True)


@pytest.mark.parametrize("strategy", ["fsdp1", "fsdp2"])
def test_fsdp_peer_cases_bitwise(strategy):
    """Under FSDP1/FSDP2: hidden states used outside the next layer, a Liger-style custom Function, a 1 MiB pool
    bound: losses and every gradient equal to the run without offload, over several AdamW steps."""
    torch.multiprocessing.spawn(_fsdp_cases_worker, args=(2, _free_port(), strategy), nprocs=2, join=True)


@pytest.mark.parametrize("ckpt", [False, True])
def test_no_grad_eval_and_forward_without_backward(ckpt):
    ref, m = tiny_qwen2(), tiny_qwen2()
    off = apply_activation_offload(m, CFG0, ckpt)
    ids = batches(0, 0)[1]
    with off.activate():  # no_grad and eval forwards inside the context
        with torch.no_grad():
            assert torch.equal(m(input_ids=ids).logits, ref(input_ids=ids).logits)
        m.eval(), ref.eval()
        with torch.no_grad():
            assert torch.equal(m(input_ids=ids).logits, ref(input_ids=ids).logits)
        m.train(), ref.train()
    # a train-mode forward with grad and no backward: state must reset, nothing leaks into the next step
    with off.activate():
        dangling = m(input_ids=batches(5, 0)[0]).logits.sum()
    assert off.stats()["n_groups"] == 4
    with pytest.raises(RuntimeError, match="activate"):
        dangling.backward()  # after the context: a clear error, never stale host data
    m.zero_grad(set_to_none=True)
    ids = _assert_steps_equal(ref, m, off, pick=lambda step: step % 2)
    # outside activate() the model is untouched: no hooks, no groups
    before = off.stats()["offloaded_bytes_last_step"]
    la, ga = _step(ref, None, ids)
    lb, gb = _step(m, off, ids, ckpt_ctx=False)
    assert la == lb and _eq(ga, gb)
    assert off.stats()["offloaded_bytes_last_step"] == before


@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("cfg", [CFG0, DEFAULTS], ids=["keep1_nohead", "defaults"])
def test_layer_output_used_outside_the_next_layer_bitwise(ckpt, cfg):
    """Hidden states in the loss and a value head on an intermediate layer: the layer boundary is marked by
    hooks, not by a node on the tensor the other consumers share, so autograd sums its gradient in the same
    order as without offload (an identity node there made gradients differ by ~1e-8)."""
    ref = train("none", "none", case="hidden")
    got = train("offload_ckpt" if ckpt else "offload", "none", cfg=cfg, case="hidden")
    assert_same(ref, got, "hidden states in the loss")
    assert got[3][-1]["offloaded_bytes_last_step"] > 0


@pytest.mark.parametrize("cfg", [CFG0, DEFAULTS], ids=["keep1_nohead", "defaults"])
def test_custom_function_saving_its_own_view_is_offloaded_and_freed(cfg):
    """A custom autograd Function that saves `x.view(-1, d)` made in its forward (Liger's fused RMSNorm): that
    view is a leaf that requires grad, but no parameter; it is offloaded and the device storage is freed
    after the layer (checked in `prepare_case`), and gradients stay bitwise."""
    ref = train("none", "none", case="liger")
    got = train("offload", "none", cfg=cfg, case="liger")
    assert_same(ref, got, "liger-style norm")


def test_pool_bound_below_one_chunk_offloads_what_fits():
    """max_pool_bytes=1 MiB (below the 256 MiB chunk): the pool holds 1 MiB, fills it, keeps the rest on the
    device; gradients bitwise."""
    lens = (64, 96)
    ref = train("none", "none", lens=lens)
    got = train("offload", "none", lens=lens, cfg=BOUND_1MIB)
    assert_same(ref, got, "max_pool_bytes=1 MiB")
    st = got[3][-1]
    assert st["offloaded_bytes_last_step"] > 0 and st["kept_bytes_last_step"] > 0, st
    assert 0 < st["pool_bytes"] <= 1 << 20 and st["pool_peak_used_bytes"] > (1 << 20) * 3 // 4, st


@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("cfg", [DEFAULTS, ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False,
                                                                   max_pool_bytes=16 << 10)],
                         ids=["defaults", "pool_16k"])
def test_nothing_outlives_the_micro_batch(ckpt, cfg, monkeypatch):
    """What the offloader holds for a micro-batch (the device storages it packed, including those that stayed
    because the pool was full, and the buffers it allocated for copies back) is released when the micro-batch
    ends: no cycle, no garbage collector needed, also while the caller still holds the graph of a forward that
    never ran backward."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from rlx.offload import copies, group
    refs = []
    entry_init, alloc = group.Entry.__init__, copies.InlineCopies.alloc

    def recording_init(self, src, nbytes):
        entry_init(self, src, nbytes)
        refs.append(StorageWeakRef(src.untyped_storage()))

    def recording_alloc(self, nbytes):
        t = alloc(self, nbytes)
        refs.append(StorageWeakRef(t.untyped_storage()))
        return t
    monkeypatch.setattr(group.Entry, "__init__", recording_init)
    monkeypatch.setattr(copies.InlineCopies, "alloc", recording_alloc)
    m = tiny_qwen2()
    off = apply_activation_offload(m, cfg, ckpt)
    gc.collect()
    gc.disable()
    try:
        for step in range(3):
            for ids in batches(step, 0):
                with off.activate():
                    loss = lm_loss(m, ids)
                    loss.backward()
                assert refs and all(r.expired() for r in refs), [r.expired() for r in refs]
                refs.clear()
        with off.activate():
            dangling = lm_loss(m, ids)  # noqa: F841 (a forward without backward; its graph stays alive)
        assert refs and all(r.expired() for r in refs)
        assert off._groups == [] and off._inflight == []
    finally:
        gc.enable()


def test_hf_checkpointing_together_is_a_clear_error():
    m = tiny_qwen2()
    off = apply_activation_offload(m, CFG0, True)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    with pytest.raises(RuntimeError, match="HF gradient checkpointing"):
        with off.activate():
            pass
