"""GPU tests of rlx.offload (streams, pinned pool): `pytest -m gpu tests/e2e/test_offload_gpu.py`.

Imports only torch, transformers, pytest and rlx.offload, so it runs on a box without ray/hydra/vllm.
"""
from __future__ import annotations

import os
import socket

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch
import torch.nn.functional as F

from rlx.offload import ActivationOffloadConfig, apply_activation_offload

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
import transformers  # noqa: E402 - a dependency of rlx (pyproject), never skipped


def qwen2(layers=6, seed=0, attn="eager", dtype=torch.float32):
    cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=768, num_hidden_layers=layers,
                                   num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                                   attn_implementation=attn, use_cache=False)
    torch.manual_seed(seed)
    m = transformers.Qwen2ForCausalLM(cfg).to(device="cuda", dtype=dtype)
    m.config._attn_implementation = attn
    return m.train()


def slow_down(model):
    """Make the compute stream lag the host, so a missing stream wait shows up as corrupted data."""
    for layer in model.model.layers:
        orig = layer.mlp.forward

        def fwd(x, _orig=orig):
            torch.cuda._sleep(200_000)
            return _orig(x)
        layer.mlp.forward = fwd


def run(model, off=None, steps=3, lens=(384, 512)):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    losses, grads = [], []
    for _ in range(steps):
        for n in lens:
            ids = torch.randint(0, 1000, (2, n), generator=g).cuda()
            ctx = off.activate() if off is not None else torch.enable_grad()
            with ctx:
                loss = F.cross_entropy(model(input_ids=ids).logits.flatten(0, 1).float(), ids.flatten()) / len(lens)
                loss.backward()
            losses.append(loss.item())
        grads.append([(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
                      for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads


@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("keep_last", [0, 1])
def test_cuda_bitwise_with_streams(ckpt, keep_last):
    ref, m = qwen2(), qwen2()
    slow_down(ref), slow_down(m)
    off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0, keep_last_layers=keep_last,
                                                              offload_head=keep_last == 0), ckpt)
    la, ga = run(ref)
    lb, gb = run(m, off)
    assert la == lb
    for s, (x, y) in enumerate(zip(ga, gb)):
        for i, (u, v) in enumerate(zip(x, y)):
            assert torch.equal(u, v), (s, i, (u - v).abs().max().item())
    st = off.stats()
    assert st["offloaded_bytes_last_step"] > 0 and all(c.is_pinned() for c in off.pool.chunks), st


@pytest.mark.parametrize("mode", ["offload", "offload_rmlp", "offload_ckpt"])
def test_cuda_bf16_bitwise_narrowed(mode):
    """bfloat16 model: RMSNorm's float32 upcasts travel narrowed and are widened on the H2D stream; bitwise."""
    ref, m = qwen2(dtype=torch.bfloat16), qwen2(dtype=torch.bfloat16)
    slow_down(ref), slow_down(m)
    off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0, recompute_mlp=mode == "offload_rmlp"),
                                   mode == "offload_ckpt")
    la, ga = run(ref)
    lb, gb = run(m, off)
    assert la == lb
    assert all(torch.equal(u, v) for x, y in zip(ga, gb) for u, v in zip(x, y))
    st = off.stats()
    assert st["moved_bytes_last_step"] > 0, st
    if mode != "offload_ckpt":
        assert st["moved_bytes_last_step"] < st["offloaded_bytes_last_step"], st
    if mode == "offload":  # SwiGLU's silu/mul outputs were rebuilt on the H2D stream, not copied
        assert st["rebuilt_bytes_last_step"] > 0, st


def test_memory_saved_and_pool_stable():
    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    m = qwen2(layers=8, attn="sdpa", dtype=torch.bfloat16)
    ids = torch.randint(0, 1000, (1, 4096), device="cuda")

    def step(ctx):
        with ctx:
            F.cross_entropy(m(input_ids=ids).logits.flatten(0, 1).float(), ids.flatten()).backward()
        m.zero_grad(set_to_none=False)

    step(torch.enable_grad())
    p_none = peak(lambda: step(torch.enable_grad()))
    off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0), False)
    step(off.activate())
    p_off = peak(lambda: step(off.activate()))
    sizes = []
    for _ in range(5):
        step(off.activate())
        sizes.append(off.stats()["pool_bytes"])
    assert p_off < 0.6 * p_none, (p_off, p_none)
    assert len(set(sizes)) == 1, sizes
    off.remove()
    offc = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0), True)
    step(offc.activate())
    p_offc = peak(lambda: step(offc.activate()))
    assert p_offc < p_off, (p_offc, p_off)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp2_cuda_bitwise():
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    own = not torch.distributed.is_initialized()  # another test module may have set up world size 1 already
    if own:
        torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1)
    assert torch.distributed.get_world_size() == 1
    try:
        mesh = init_device_mesh(DEVICE, (1,))
        out = []
        for mode in ("none", "offload", "offload_ckpt"):
            m = qwen2()
            for layer in m.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
            off = None if mode == "none" else apply_activation_offload(
                m, ActivationOffloadConfig(min_tensor_bytes=0), mode == "offload_ckpt")
            out.append(run(m, off, steps=2))
        for la, ga in out[1:]:
            assert la == out[0][0]
            assert all(torch.equal(u, v) for x, y in zip(out[0][1], ga) for u, v in zip(x, y))
    finally:
        if own:
            torch.distributed.destroy_process_group()


# ---------------------------------------------------------------- peer cases at scale (items of the offload issue)
# A larger model than above (hidden 1024, 4 layers, SDPA, GQA), bf16 compute, deterministic algorithms: plain bf16,
# fp32 weights under autocast, and FSDP2 with bf16 mixed precision (fp32 master weights and reduction). Every
# comparison is torch.equal on the losses and on every gradient of every step against the run without offload;
# each test prints one line per run, so its output says which configuration differs and by how much.
SETUPS = ["bf16", "autocast", "fsdp2_mp"]
DEVICE = "cuda"
DIMS = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
            num_key_value_heads=4, vocab_size=32000)
LENS = (1024, 768)  # tokens of the two micro-batches of a step (batch 1)


def qwen2_1024(dtype):
    cfg = transformers.Qwen2Config(**DIMS, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        m = transformers.Qwen2ForCausalLM(cfg).to(dtype)
    m.config._attn_implementation = "sdpa"
    return m.train()


@pytest.fixture(scope="module")
def world1():
    """A world of one NCCL rank for FSDP2 (kept if another test module made one)."""
    own = not torch.distributed.is_initialized()
    if own:
        torch.distributed.init_process_group("nccl" if DEVICE == "cuda" else "gloo",
                                             init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1)
    yield
    if own:
        torch.distributed.destroy_process_group()


class deterministic:
    def __enter__(self):
        self.was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.was)


def build(setup: str, value_head: bool = False):
    """(model, autocast?) for a setup; with `value_head`, `model.value_head` reads layer 1's output."""
    m = qwen2_1024(torch.bfloat16 if setup == "bf16" else torch.float32)
    if value_head:
        torch.manual_seed(7)
        m.value_head = torch.nn.Linear(DIMS["hidden_size"], 1, device=DEVICE, dtype=next(m.parameters()).dtype)
        m._values = []
        m.model.layers[1].register_forward_hook(
            lambda mod, args, out: m._values.append(m.value_head(out[0] if isinstance(out, tuple) else out)))
    if setup == "fsdp2_mp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh(DEVICE, (1,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in m.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(m, mesh=mesh, mp_policy=mp)
    return m, setup == "autocast"


def lm_loss(m, ids, hidden: bool):
    out = m(input_ids=ids, output_hidden_states=hidden)
    loss = F.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    if hidden:  # hidden states in the loss and a value head on layer 1: outputs used outside the next layer
        loss = loss + 0.1 * sum(h.float().square().mean() for h in out.hidden_states)
        loss = loss + m._values.pop().float().square().mean()
    return loss


def train_steps(m, off, autocast: bool, hidden: bool = False, steps: int = 3, mem=None):
    """AdamW steps over two micro-batches each; (losses, grads per step). `mem`: a list that gets
    torch.cuda.memory_allocated() after each step (before and after gc.collect())."""
    import gc
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    losses, grads = [], []
    for _ in range(steps):
        for n in LENS:
            ids = torch.randint(0, DIMS["vocab_size"], (1, n), generator=g).to(DEVICE)
            with (off.activate() if off is not None else torch.enable_grad()):
                with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
                    loss = lm_loss(m, ids, hidden) / len(LENS)
                loss.backward()
            losses.append(loss.item())
        if mem is None:  # (measuring memory: keep no copies, they would be what grows)
            grads.append([(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).float().clone()
                          for p in m.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mem is not None:
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated()
            gc.collect()
            torch.cuda.synchronize()
            mem.append((held, torch.cuda.memory_allocated()))
    return losses, grads


def compare(name: str, ref, got) -> bool:
    """Print one line: bitwise, or where it differs first and by how much. True when bitwise."""
    (la, ga), (lb, gb) = ref, got
    worst = []
    for s, (x, y) in enumerate(zip(ga, gb)):
        for i, (u, v) in enumerate(zip(x, y)):
            if not torch.equal(u, v):
                d = (u - v).abs()
                worst.append((s, i, d.max().item(), (d > 0).float().mean().item()))
    same = la == lb and not worst
    if same:
        print(f"{name}: bitwise", flush=True)
    else:
        dl = max(abs(a - b) for a, b in zip(la, lb))
        first = min(worst, key=lambda w: w[0]) if worst else None
        big = max(worst, key=lambda w: w[2]) if worst else None
        print(f"{name}: DIFFERS max|dloss|={dl:.3e}, {len(worst)} grads differ; first at step {first and first[0]} "
              f"(param {first and first[1]}); largest {big and big[2]:.3e} (step {big and big[0]}, param "
              f"{big and big[1]}, {big and 100 * big[3]:.1f}% of elements)", flush=True)
    return same


@pytest.mark.parametrize("setup", ["bf16", "fsdp2_mp"])
def test_cuda_outputs_used_outside_the_next_layer_bitwise(setup, world1):
    """Item 1: hidden states in the loss and a value head on an intermediate layer; bitwise over 3 steps."""
    with deterministic():
        m, ac = build(setup, value_head=True)
        ref = train_steps(m, None, ac, hidden=True)
        results = []
        for ckpt in (False, True):
            m, ac = build(setup, value_head=True)
            off = apply_activation_offload(m, ActivationOffloadConfig(), ckpt)
            results.append(compare(f"item1 {setup} defaults ckpt={ckpt}", ref, train_steps(m, off, ac, hidden=True)))
    assert all(results)


class _SyncedCopies:
    """Mixed into the CUDA copy engine: a device synchronize after every operation, so no stream can race
    another. A difference that goes away with it is a stream-ordering bug; one that stays is not."""

    def copy_out(self, *a):
        super().copy_out(*a)
        torch.cuda.synchronize()

    def alloc(self, nbytes):
        t = super().alloc(nbytes)
        torch.cuda.synchronize()
        return t

    def copy_in(self, *a):
        super().copy_in(*a)
        torch.cuda.synchronize()

    def fence_out(self):
        torch.cuda.synchronize()
        return super().fence_out()

    def fence_in(self):  # after each storage's copy back or elementwise rebuild
        torch.cuda.synchronize()
        return super().fence_in()

    def finish(self):
        super().finish()
        torch.cuda.synchronize()


def _variants():
    """(name, config kwargs, checkpointing, patch(offloader, monkeypatch)) of the defaults and of each suspect
    turned off or isolated."""
    from rlx.offload import group
    from rlx.offload.copies import StreamCopies

    def synced(off, mp):
        off._copies = type("Synced", (_SyncedCopies, StreamCopies), {})(off.device)

    def no_narrow(off, mp):
        mp.setattr(group, "narrow_dtype", lambda t, nbytes: None)
    return [("defaults", {}, False, None), ("defaults+ckpt", {}, True, None),
            ("synced_copies", {}, False, synced), ("no_narrowing", {}, False, no_narrow),
            ("rebuild_pointwise=False", dict(rebuild_pointwise=False), False, None),
            ("offload_head=False", dict(offload_head=False), False, None),
            ("prefetch_layers=0", dict(prefetch_layers=0), False, None),
            ("keep_last_layers=0", dict(keep_last_layers=0), False, None),
            ("min_tensor_bytes=0", dict(min_tensor_bytes=0), False, None)]


@pytest.mark.parametrize("setup", SETUPS)
def test_cuda_defaults_bitwise_at_scale(setup, world1, monkeypatch):
    """Item 2: ActivationOffloadConfig() on hidden 1024 x 4 layers, bf16 compute, deterministic algorithms:
    bitwise against no offload over 3 steps. Each suspect (narrowing, rebuild, the head groups, prefetch, the
    stream ordering) is also run on its own, and every run prints a line, so a failure says where it is."""
    with deterministic():
        m, ac = build(setup)
        ref = train_steps(m, None, ac)
        results = {}
        for name, kw, ckpt, patch in _variants():
            with monkeypatch.context() as mp:
                m, ac = build(setup)
                off = apply_activation_offload(m, ActivationOffloadConfig(**kw), ckpt)
                if patch is not None:
                    patch(off, mp)
                results[name] = compare(f"item2 {setup} {name}", ref, train_steps(m, off, ac))
                assert off.stats()["offloaded_bytes_last_step"] > 0
    assert all(results.values()), results


@pytest.mark.parametrize("setup", ["bf16", "fsdp2_mp"])
def test_cuda_memory_after_each_step(setup, world1):
    """Item 5: device memory allocated after each step (after the optimizer step and zero_grad) is the same at
    every step, within a few MiB of the run without offload, and nothing more is freed by gc.collect() (no
    reference cycle holds device memory)."""
    import gc
    with deterministic():
        mems = {}
        for name in ("none", "offload", "offload_ckpt"):
            gc.collect()  # the previous run's model (HF models hold reference cycles) is gone before this one
            m, ac = build(setup)
            off = None if name == "none" else apply_activation_offload(m, ActivationOffloadConfig(),
                                                                       name == "offload_ckpt")
            mems[name] = []
            train_steps(m, off, ac, steps=6, mem=mems[name])
            print(f"item5 {setup} {name}: allocated after each step (MB, before/after gc.collect): "
                  + ", ".join(f"{a / 1e6:.1f}/{b / 1e6:.1f}" for a, b in mems[name]), flush=True)
            del m, off
    for name, mem in mems.items():
        assert all(a == b for a, b in mem), (name, mem)  # nothing held by cycles
        assert len({a for a, _ in mem}) == 1, (name, mem)  # the same after every step
        # within a few MiB of no offload (measured on an H200: FSDP2 +1.0 MiB, plain bf16 -4.5 MiB; constant)
        assert abs(mem[-1][0] - mems["none"][-1][0]) <= 8 << 20, (name, mem, mems["none"])
