"""CPU tests of rlx.offload: real FSDP1/FSDP2 over gloo on a tiny Qwen2, bitwise gradient checks.

On CPU the offload machinery runs for real (pack/unpack, groups, host pool copies), only without streams.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ranks import end_rank
from rlx.offload import ActivationOffloadConfig, apply_activation_offload, find_decoder_layers

import transformers  # noqa: E402 - a dependency of rlx (pyproject), never skipped

CFG0 = ActivationOffloadConfig(min_tensor_bytes=0, keep_last_layers=1, offload_head=False, pin_memory=False)
DEFAULTS = ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False)  # the defaults, every tensor offloaded


def tiny_qwen2(num_layers: int = 4, seed: int = 0):
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                   attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg).float()
    model.config._attn_implementation = "sdpa"
    return model


def wrap_fsdp(model, strategy: str):
    """Tiny local FSDP helper: shard each decoder layer, then the root."""
    if strategy == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        layer_cls = type(model.model.layers[0])
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({layer_cls}), device_id=torch.device("cpu"),
                    use_orig_params=False)
    if strategy == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    assert strategy == "none"
    return model


def local_grads(model):
    out = []
    for p in model.parameters():
        g = p.grad
        if g is not None and hasattr(g, "to_local"):
            g = g.to_local()
        out.append(None if g is None else g.detach().clone())
    return out


def local_params(model):
    return [(p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in model.parameters()]


def batches(step: int, rank: int, lens=(7, 12)):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randint(0, 300, (2, n), generator=g) for n in lens]


# ---------------------------------------------------------------- cases the offload suites of peers test
class LigerStyleRMSNorm(torch.autograd.Function):
    """The pattern of Liger's fused RMSNorm (verl's `use_liger`): the input is reshaped inside forward and that
    view is saved. Made under the Function's no-grad forward, the view is a leaf that requires grad."""

    @staticmethod
    def forward(ctx, x, w, eps):
        X = x.view(-1, x.shape[-1])
        rstd = torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(X, w, rstd)
        return (X * rstd * w).view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        X, w, rstd = ctx.saved_tensors
        dY = dy.reshape(X.shape)
        n = X * rstd
        dn = dY * w
        dX = rstd * (dn - n * (dn * n).mean(-1, keepdim=True))
        return dX.view(dy.shape), (dY * n).sum(0), None


def use_liger_style_norm(model):
    """Each layer's post-attention norm becomes `LigerStyleRMSNorm`; returns the list that collects a weak
    reference to the storage of each norm input (the residual sum: nothing but the norm's saved view holds it)
    of the forwards with grad."""
    from torch.multiprocessing.reductions import StorageWeakRef
    inputs = []
    for layer in model.model.layers:
        norm = layer.post_attention_layernorm

        def forward(x, norm=norm):
            if torch.is_grad_enabled():
                inputs.append(StorageWeakRef(x.untyped_storage()))
            return LigerStyleRMSNorm.apply(x, norm.weight, norm.variance_epsilon)
        norm.forward = forward
    return inputs


def lm_loss(model, ids):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, 300), ids[:, 1:].reshape(-1))


def prepare_case(model, case: str):
    """(loss_fn(model, ids), check(offloader) run between forward and backward) for one of the cases:
    plain: next-token loss. hidden: a layer's output is used outside the next layer too (every hidden state in
    the loss, and a value head on layer 1's output, as in an auxiliary/value head). liger: a custom Function that
    saves a view made in its forward; after forward, the norm inputs of the offloaded layers must be freed."""
    if case == "plain":
        return lm_loss, None
    if case == "hidden":
        torch.manual_seed(7)
        head = nn.Linear(model.config.hidden_size, 1)
        model.value_head = head  # a submodule: FSDP-wrapped and optimized with the model
        values = []
        model.model.layers[1].register_forward_hook(
            lambda mod, args, out: values.append(head(out[0] if isinstance(out, tuple) else out)))

        def loss_fn(m, ids):
            values.clear()
            out = m(input_ids=ids, output_hidden_states=True)
            ce = F.cross_entropy(out.logits[:, :-1].reshape(-1, 300), ids[:, 1:].reshape(-1))
            return ce + 0.1 * sum(h.square().mean() for h in out.hidden_states) + values[0].square().mean()
        return loss_fn, None
    assert case == "liger"
    inputs = use_liger_style_norm(model)

    def check(off):
        n = len(off.layers)
        offloaded = n if off.checkpointing else n - off.keep_last_layers  # checkpointing saves layer inputs only
        expired = [w.expired() for w in inputs[-n:]]
        assert expired == [True] * offloaded + [False] * (n - offloaded), expired
        inputs.clear()
    return lm_loss, check


def train(mode: str, strategy: str, steps: int = 3, lens=(7, 12), num_layers: int = 4, cfg=CFG0,
          case: str = "plain"):
    """Run `steps` AdamW steps of grad accumulation over micro-batches; return (losses, grads per step, params)."""
    model = tiny_qwen2(num_layers)
    loss_fn, check = prepare_case(model, case)
    if mode == "hf_ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    model = wrap_fsdp(model, strategy)
    off = None
    if mode.startswith("offload"):
        off = apply_activation_offload(model, cfg, enable_gradient_checkpointing=mode == "offload_ckpt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    losses, grads, stats = [], [], []
    for step in range(steps):
        mbs = batches(step, rank, lens)
        for ids in mbs:
            ctx = off.activate() if off is not None else torch.enable_grad()
            with ctx:
                loss = loss_fn(model, ids) / len(mbs)
                if check is not None and off is not None:
                    check(off)
                loss.backward()
            losses.append(loss.item())
            if off is not None:
                stats.append(off.stats())
        grads.append(local_grads(model))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads, local_params(model), stats


def assert_same(a, b, what):
    la, ga, pa, _ = a
    lb, gb, pb, _ = b
    assert la == lb, f"{what}: losses differ {la} vs {lb}"
    for s, (x, y) in enumerate(zip(ga, gb)):
        for i, (u, v) in enumerate(zip(x, y)):
            assert (u is None) == (v is None), f"{what}: step {s} grad {i} presence differs"
            if u is not None:
                assert torch.equal(u, v), f"{what}: step {s} grad {i} differs, max {(u - v).abs().max()}"
    for i, (u, v) in enumerate(zip(pa, pb)):
        assert torch.equal(u, v), f"{what}: final param {i} differs"


# ---------------------------------------------------------------- FSDP over gloo, world size 2
def _fsdp_worker(rank: int, world: int, port: int, strategy: str):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    try:
        ref = train("none", strategy)
        off = train("offload", strategy)
        assert_same(ref, off, f"{strategy} offload vs none")
        st = off[3][-1]
        assert st["n_groups"] == 4 and st["offloaded_bytes_last_step"] > 0, st
        all_out = ActivationOffloadConfig(min_tensor_bytes=0, keep_last_layers=0, offload_head=True, pin_memory=False)
        off_all = train("offload", strategy, cfg=all_out)
        assert_same(ref, off_all, f"{strategy} offload keep_last_layers=0 + offload_head vs none")
        assert off_all[3][-1]["n_groups"] == 6, off_all[3][-1]
        dflt = train("offload", strategy, cfg=DEFAULTS)  # keep_last_layers=1, offload_head=True
        assert_same(ref, dflt, f"{strategy} offload (defaults) vs none")
        assert dflt[3][-1]["n_groups"] == 6, dflt[3][-1]
        assert dflt[3][-1]["rebuilt_bytes_last_step"] > 0, dflt[3][-1]  # SwiGLU's silu/mul outputs
        norb = train("offload", strategy, cfg=ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False,
                                                                     rebuild_pointwise=False))
        assert_same(ref, norb, f"{strategy} offload rebuild_pointwise=False vs none")
        assert norb[3][-1]["rebuilt_bytes_last_step"] == 0
        assert dflt[3][-1]["moved_bytes_last_step"] + dflt[3][-1]["rebuilt_bytes_last_step"] == \
            norb[3][-1]["moved_bytes_last_step"]
        rmlp = train("offload", strategy, cfg=ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False,
                                                                     recompute_mlp=True))
        assert_same(ref, rmlp, f"{strategy} offload recompute_mlp vs none")
        assert 0 < rmlp[3][-1]["offloaded_bytes_last_step"] < dflt[3][-1]["offloaded_bytes_last_step"]
        hf = train("hf_ckpt", strategy)
        ock = train("offload_ckpt", strategy, cfg=all_out if strategy == "fsdp2" else CFG0)
        assert_same(hf, ock, f"{strategy} offload+ckpt vs HF non-reentrant ckpt")
        assert_same(ref, ock, f"{strategy} offload+ckpt vs none")
        ockd = train("offload_ckpt", strategy, cfg=DEFAULTS)  # keep_last_layers=0, offload_head=True
        assert_same(ref, ockd, f"{strategy} offload+ckpt (defaults) vs none")
        assert ockd[3][-1]["n_groups"] == 6, ockd[3][-1]
        # with checkpointing only layer inputs are saved: far fewer bytes than offloading everything
        assert 0 < ock[3][-1]["offloaded_bytes_last_step"] < st["offloaded_bytes_last_step"] / 4
    finally:
        end_rank()


BOUND_1MIB = ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False, max_pool_bytes=1 << 20)


def _fsdp_cases_worker(rank: int, world: int, port: int, strategy: str):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    try:
        for case in ("hidden", "liger"):
            ref = train("none", strategy, case=case)
            for mode in ("offload", "offload_ckpt"):
                for cfg in (CFG0, DEFAULTS):
                    got = train(mode, strategy, cfg=cfg, case=case)
                    assert_same(ref, got, f"{strategy} {case} {mode} keep_last={cfg.keep_last_layers} vs none")
                    assert got[3][-1]["offloaded_bytes_last_step"] > 0
        lens = (64, 96)  # several MiB of activations per micro-batch
        ref = train("none", strategy, lens=lens)
        got = train("offload", strategy, lens=lens, cfg=BOUND_1MIB)
        assert_same(ref, got, f"{strategy} max_pool_bytes=1 MiB vs none")
        st = got[3][-1]
        assert st["offloaded_bytes_last_step"] > 0 and st["kept_bytes_last_step"] > 0, st
        assert 0 < st["pool_bytes"] <= 1 << 20, st
    finally:
        end_rank()


# ---------------------------------------------------------------- single process, no FSDP
def test_layers_found_and_few_layers_rejected():
    assert len(find_decoder_layers(tiny_qwen2(4))) == 4
    with pytest.raises(ValueError, match="enable_activation_offload"):
        apply_activation_offload(tiny_qwen2(2), CFG0, False)


def _eq(ga, gb):
    return len(ga) == len(gb) and all((x is None and y is None) or (x is not None and y is not None
                                                                    and torch.equal(x, y)) for x, y in zip(ga, gb))


def _step(model, off, ids, ckpt_ctx=True):
    ctx = off.activate() if (off is not None and ckpt_ctx) else torch.enable_grad()
    with ctx:
        loss = F.cross_entropy(model(input_ids=ids).logits.flatten(0, 1), ids.flatten())
        loss.backward()
    g = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.item(), g


def _assert_steps_equal(ref, m, off, pick, steps=2):
    """Train `ref` (no offload) and `m` (offload) side by side: identical losses and gradients every step."""
    for step in range(steps):
        ids = batches(step, 0)[pick(step)]
        la, ga = _step(ref, None, ids)
        lb, gb = _step(m, off, ids)
        assert la == lb
        assert _eq(ga, gb)
    return ids


@pytest.mark.parametrize("ckpt", [False, True])
def test_skipped_layer_is_correct(ckpt):
    ref, m = tiny_qwen2(), tiny_qwen2()
    off = apply_activation_offload(m, CFG0, ckpt)
    for model in (ref, m):  # layer 1 is skipped in forward (its wrapper is never called)
        layers = model.model.layers
        model.model.layers = nn.ModuleList([layers[0], layers[2], layers[3]])
        model.model.config.num_hidden_layers = 3
        model.model._skipped = layers[1]
    _assert_steps_equal(ref, m, off, pick=lambda step: 1)
    assert off.stats()["n_groups"] == 3


def test_pool_bound_does_not_stop_at_the_first_miss():
    from rlx.offload.pool import HostPool
    pool = HostPool(chunk_bytes=256 << 20, pin_memory=False, max_bytes=1 << 20)
    assert pool.allocate(600_000) is not None
    assert pool.allocate(600_000) is None  # would pass the bound: stays on the device
    assert pool.allocate(300_000) is not None  # smaller: still fits in what is left
    assert pool.capacity == 1 << 20 and len(pool.chunks) == 1
    pool.reset()
    assert pool.allocate(1 << 20) is not None and pool.allocate(1) is None


def test_group_transitions_follow_the_table():
    """Each event moves a group only along `TRANSITIONS`; any other (event, state) pair changes nothing."""
    from rlx.offload.copies import InlineCopies
    from rlx.offload.group import TRANSITIONS, Group, GroupState, OffloadStats, Packed
    from rlx.offload.pool import HostPool

    def group(with_entry: bool):
        g = Group(0, 0, set(), None, InlineCopies(torch.device("cpu")), HostPool(1 << 20, False), OffloadStats(),
                  True)
        if with_entry:
            x = torch.randn(64, requires_grad=True)
            g.pack(x.exp())
        return g
    g = group(True)
    assert g.state is GroupState.PACKING
    for event, expect in [("needed", GroupState.PACKING), ("backward_done", GroupState.PACKING),
                          ("forward_ended", GroupState.COPYING), ("backward_done", GroupState.COPYING),
                          ("copies_due", GroupState.OFFLOADED), ("copies_due", GroupState.OFFLOADED),
                          ("needed", GroupState.RESIDENT), ("needed", GroupState.RESIDENT),
                          ("backward_done", GroupState.OFFLOADED), ("micro_batch_ended", GroupState.CLOSED)]:
        before = g.state
        getattr(g, event)()
        assert g.state is expect, (event, before, g.state)
        assert g.state is before or g.state in TRANSITIONS[event][before]
    empty = group(False)
    empty.forward_ended()
    for event in ("copies_due", "needed", "backward_done"):
        getattr(empty, event)()
        assert empty.state is GroupState.KEPT
    with pytest.raises(RuntimeError, match="released before its backward"):
        g.unpack(Packed(g, None, torch.zeros(1)))  # a closed group: never stale data


@pytest.mark.parametrize("ckpt", [False, True])
def test_fused_head_that_never_calls_the_output_projection(ckpt, monkeypatch):
    """The engine's head reads `lm_head.weight` inside the model's forward and never calls `lm_head`: the last
    groups are still copying when backward starts; they keep their device copies (nothing of theirs is copied
    back) and the gradients are bitwise."""
    from rlx.offload import copies
    copied_back = []
    copy_in = copies.InlineCopies.copy_in

    def recording_copy_in(self, src, dst, narrow):
        copied_back.append(src.data_ptr())
        copy_in(self, src, dst, narrow)
    monkeypatch.setattr(copies.InlineCopies, "copy_in", recording_copy_in)

    def fused_loss(m, ids):
        hidden = m.model(input_ids=ids).last_hidden_state
        logits = F.linear(hidden, m.lm_head.weight)
        return F.cross_entropy(logits[:, :-1].reshape(-1, 300), ids[:, 1:].reshape(-1))
    ref, m = tiny_qwen2(), tiny_qwen2()
    off = apply_activation_offload(m, DEFAULTS, ckpt)
    for step in range(2):
        ids = batches(step, 0)[1]
        la = fused_loss(ref, ids)
        la.backward()
        copied_back.clear()
        with off.activate():
            lb = fused_loss(m, ids)
            copying = [e.host.data_ptr() for g in off._groups if g.state.name == "COPYING"
                       for e in g.entries.values() if e.host is not None]
            lb.backward()
        assert copying and not set(copying) & set(copied_back), (len(copying), len(copied_back))
        assert la.item() == lb.item()
        assert _eq([p.grad for p in ref.parameters()], [p.grad for p in m.parameters()])
        ref.zero_grad(set_to_none=True), m.zero_grad(set_to_none=True)


@pytest.mark.parametrize("ckpt", [False, True])
def test_pool_does_not_grow(ckpt):
    torch.manual_seed(0)
    m = tiny_qwen2()
    off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False,
                                                              pool_chunk_bytes=1 << 20), ckpt)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    sizes, per_mb = [], []
    for step in range(20):
        for n in (48, 80, 32):  # micro-batches of different lengths
            ids = torch.randint(0, 300, (2, n))
            with off.activate():
                F.cross_entropy(m(input_ids=ids).logits.flatten(0, 1), ids.flatten()).backward()
            per_mb.append(off.stats()["offloaded_bytes_last_step"])
        opt.step()
        opt.zero_grad()
        s = off.stats()
        sizes.append((s["pool_bytes"], s["pool_chunk_allocs"]))
    assert min(per_mb) > 0
    assert sizes[0][0] > 0 and all(s == sizes[0] for s in sizes), sizes
    # the pool holds one micro-batch (the longest), not a step's worth: slices are reused
    assert off.stats()["pool_peak_used_bytes"] <= max(per_mb) * 1.05 + 64 * 512
    assert "pool=" in off.describe()


# ---------------------------------------------------------------- views sharing one storage (GQA, stride 0)
class _GQALayer(nn.Module):
    """k is saved as several views of one storage: itself, expanded with stride 0 to all query heads (as SDPA
    GQA does), and as a square matrix next to its transpose (same shape, other strides: a pointer-only
    de-duplication returns the wrong one silently)."""

    def __init__(self, d=16, kv=2, rep=3):
        super().__init__()
        self.q = nn.Linear(d, d * kv * rep // kv, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d * kv * rep // kv, d, bias=False)
        self.kv, self.rep = kv, rep

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.kv
        q = self.q(x).view(b, s, self.kv, self.rep, hd)
        k = self.k(x).view(b, s, self.kv, 1, hd)
        k_exp = k.expand(b, s, self.kv, self.rep, hd)  # stride 0 over `rep`, same storage as k
        y = torch.mul(q, k_exp)  # saves k_exp (stride-0 view) and q
        y = y * k.transpose(-1, -2).sum(-2, keepdim=True).sigmoid()  # saves another view of k's storage
        z = k.squeeze(3).sin()  # saves k viewed as (b, s, kv, hd)
        k_sq = k.reshape(b, s, 4, d // 4)
        kk = torch.matmul(k_sq, k_sq.transpose(-1, -2))  # same storage, same shape, different strides
        return x + self.o(y.reshape(b, s, -1)) + z.reshape(b, s, d) + kk.reshape(b, s, d)


class _GQAModel(nn.Module):
    _no_split_modules = ["_GQALayer"]

    def __init__(self, n=4):
        super().__init__()
        self.layers = nn.ModuleList([_GQALayer() for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("ckpt", [False, True])
def test_views_of_one_storage_restored_exactly(ckpt):
    torch.manual_seed(0)
    ref = _GQAModel()
    m = _GQAModel()
    m.load_state_dict(ref.state_dict())
    off = apply_activation_offload(m, CFG0, ckpt)
    x = torch.randn(2, 5, 16)
    ref(x).square().sum().backward()
    with off.activate():
        m(x).square().sum().backward()
    assert off.stats()["offloaded_bytes_last_step"] > 0
    for (n, p), q in zip(ref.named_parameters(), m.parameters()):
        assert torch.equal(p.grad, q.grad), n


# ---------------------------------------------------------------- bfloat16: float32 upcasts travel narrowed
@pytest.mark.parametrize("mode", ["offload", "offload_ckpt", "offload_rmlp"])
def test_bf16_narrowed_upcasts_bitwise(mode):
    """RMSNorm saves `x.to(float32)` of a bfloat16 x: it travels as bfloat16 (half the bytes) and comes back
    bit for bit; gradients equal those without offload."""
    def model():
        return tiny_qwen2(seed=3).to(torch.bfloat16)

    ref, m = model(), model()
    cfg = ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False, recompute_mlp=mode == "offload_rmlp")
    off = apply_activation_offload(m, cfg, mode == "offload_ckpt")
    _assert_steps_equal(ref, m, off, pick=lambda step: 1)
    st = off.stats()
    if mode == "offload_ckpt":  # only layer/head inputs (bfloat16): nothing to narrow
        assert st["moved_bytes_last_step"] == st["offloaded_bytes_last_step"] > 0, st
    else:
        assert 0 < st["moved_bytes_last_step"] < st["offloaded_bytes_last_step"], st


def test_narrow_detection():
    from rlx.offload.exact import narrow_dtype as _narrow_dtype
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    h = x * 2
    up = h.to(torch.float32)
    assert _narrow_dtype(up, up.numel() * 4) is torch.bfloat16
    assert _narrow_dtype(x.to(torch.float32), 128) is torch.bfloat16  # from a leaf
    assert _narrow_dtype(up[1:], up.numel() * 4) is None  # a view: not the whole storage
    assert _narrow_dtype(up * 1, up.numel() * 4) is None  # not an upcast
    assert _narrow_dtype(torch.randn(4, 8, requires_grad=True).double().float(), 128) is None  # from float64
    y = h.to(torch.float32)
    y.add_(1e-3)  # written in place after the upcast: no longer exactly bfloat16 values
    assert _narrow_dtype(y, 128) is None


# ---------------------------------------------------------------- elementwise outputs rebuilt, not copied
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_pool", [None, 40_000])
def test_rebuild_pointwise_bitwise(dtype, max_pool):
    """SwiGLU's silu(gate) and silu(gate)*up are rebuilt from gate and up on the way back: bit-identical
    gradients, fewer bytes moved. With a tiny pool some sources stay on the device (kept) and the rebuild
    reads them there."""
    ref, m = tiny_qwen2(seed=5).to(dtype), tiny_qwen2(seed=5).to(dtype)
    cfg = ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False, max_pool_bytes=max_pool,
                                  pool_chunk_bytes=1 << 20)
    off = apply_activation_offload(m, cfg, False)
    _assert_steps_equal(ref, m, off, pick=lambda step: step % 2, steps=3)
    st = off.stats()
    assert st["rebuilt_bytes_last_step"] > 0, st
    if max_pool is not None:
        assert st["kept_bytes_last_step"] > 0, st


def test_recipe_detection():
    from rlx.offload.group import Entry as _Entry, Packed as _Packed
    from rlx.offload.exact import recipe as _recipe

    def entries_of(*ts):  # as the pack hook records them: by the autograd output that produced each tensor
        return {(id(t.grad_fn), t.output_nr): (t.grad_fn, _Entry(t, t.untyped_storage().nbytes()),
                                               _Packed(None, None, t)) for t in ts}

    w = torch.randn(8, 8, requires_grad=True)
    gate, up = torch.randn(4, 8) @ w, torch.randn(4, 8) @ w
    nb = 4 * 8 * 4
    act = F.silu(gate)
    assert _recipe(entries_of(gate), act, nb)[0] == "silu"
    assert _recipe(entries_of(), act, nb) is None  # the input is not offloaded in this group
    prod = act * up
    assert _recipe(entries_of(act, up), prod, nb)[0] == "mul"
    assert _recipe(entries_of(act, up), prod.view(32), nb)[0] == "mul"  # a view of the whole output
    assert _recipe(entries_of(act), prod, nb) is None  # one input missing
    assert _recipe(entries_of(gate), act * w[0], nb) is None  # broadcast with a parameter
    view = gate[:, 2:6]
    assert _recipe(entries_of(view), F.silu(view), nb // 2)[2:] == (torch.float32, (4, 4))  # a strided view
    assert _recipe(entries_of(gate), F.silu(view), nb // 2) is None  # consumed a view that was not packed
    assert _recipe(entries_of(gate), gate.exp(), nb) is None  # not a rebuildable op
    y = F.silu(gate)
    y.mul_(2)  # changed in place after it was computed
    assert _recipe(entries_of(gate), y, nb) is None


def test_rebuild_never_reads_saved_tensors_of_other_hooks():
    """Finding a recipe must not unpack tensors saved under another hook (e.g. a checkpointed final norm):
    with checkpointing, nothing is rebuilt and no recompute runs during forward."""
    m = tiny_qwen2(seed=2)
    calls = []
    norm = m.model.norm
    orig = norm.forward
    norm.forward = lambda *a, **k: (calls.append(torch.is_grad_enabled()), orig(*a, **k))[1]
    off = apply_activation_offload(m, DEFAULTS, True)  # checkpoints the patched forward
    ids = batches(0, 0)[1]
    with off.activate():
        loss = m(input_ids=ids, labels=ids).loss
        n_fwd = len(calls)
        loss.backward()
    assert n_fwd == 1 and len(calls) == 2, calls  # one forward, one recompute in backward
    assert off.stats()["rebuilt_bytes_last_step"] == 0
