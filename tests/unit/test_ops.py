"""CPU tests of rlx.ops: the chunked log-prob head against the full-logits path, and the token-tiled MLP against
the untiled model (plain, checkpointed, with activation offload, under FSDP1/FSDP2 over gloo).

Tiled MLP exactness: outputs and input gradients are row-wise, so they must be bit for bit equal. The MLP's
parameter gradients are sums over tokens; they are bit for bit equal where this machine's BLAS sums a
token-reduction GEMM in K-blocks of the tile size (`_blas_sums_in_tiles`, checked here with plain torch.mm, not
with the code under test); elsewhere they must agree to float32 rounding.
"""
from __future__ import annotations

import contextlib
import copy
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
import torch.nn.functional as F

from ranks import end_rank
from rlx.algos import core_algos
from rlx.ops import apply_tiled_mlp, log_probs_from_hidden

import transformers  # noqa: E402 - a dependency of rlx (pyproject), never skipped


# ================================================================ fused (chunked) log-prob head
def _head_inputs(n=37, h=16, v=300, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g) * 2).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h ** 0.5).to(dtype).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, b, targets


def _full(hidden, weight, bias, targets, temperature, with_entropy):
    """The actor's log-prob math today: full logits, logprobs_from_logits / entropy_from_logits."""
    logits = F.linear(hidden, weight, bias).float() / temperature
    ent = core_algos.entropy_from_logits(logits) if with_entropy else None
    return core_algos.logprobs_from_logits(logits, targets), ent


def _loss(lp, ent, use):
    g = torch.Generator().manual_seed(7)
    c_lp, c_ent = torch.randn(lp.shape, generator=g), torch.randn(lp.shape, generator=g)
    loss = 0
    if "lp" in use:
        loss = loss + (c_lp * lp).sum()
    if "ent" in use:
        loss = loss + (c_ent * ent).sum()
    return loss


def _grads(*ts):
    out = [None if t is None else t.grad.clone() for t in ts]
    for t in ts:
        if t is not None:
            t.grad = None
    return out


@pytest.mark.parametrize("chunk", [1, 8, 16, 1000])
@pytest.mark.parametrize("use", ["lp", "lp+ent", "ent", "lp (entropy returned, unused)"])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_head_matches_full_logits(chunk, use, bias):
    hidden, weight, b, targets = _head_inputs(bias=bias)
    with_entropy = "ent" in use
    temperature = 0.7
    lp_ref, ent_ref = _full(hidden, weight, b, targets, temperature, with_entropy)
    _loss(lp_ref, ent_ref, use).backward()
    ref_grads = _grads(hidden, weight, b)
    lp, ent = log_probs_from_hidden(hidden, weight, b, targets, temperature, chunk_size=chunk,
                                    with_entropy=with_entropy)
    assert lp.dtype == torch.float32 and lp.shape == targets.shape
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-5)
    if with_entropy:
        assert ent.dtype == torch.float32
        torch.testing.assert_close(ent, ent_ref, rtol=0, atol=1e-5)
    else:
        assert ent is None
    _loss(lp, ent, use).backward()
    for name, g, r in zip(("hidden", "weight", "bias"), _grads(hidden, weight, b), ref_grads):
        assert (g is None) == (r is None), name
        if g is not None:
            assert g.dtype == r.dtype
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5, msg=name)
    assert targets.grad is None


@pytest.mark.parametrize("chunk", [None, 1, 8, 1000])
def test_sum_pi_squared_from_hidden(chunk):
    """actor.calculate_sum_pi_squared: sum_v pi_v^2 of the temperature-scaled distribution, chunk by chunk equal to
    the full softmax's (computed here as sum(softmax^2), not the logsumexp form the code uses)."""
    from rlx.ops.log_prob_head import sum_pi_squared_from_hidden

    hidden, weight, b, _ = _head_inputs(bias=True)
    expected = torch.softmax(F.linear(hidden, weight, b).double() / 0.7, dim=-1).square().sum(-1)
    got = sum_pi_squared_from_hidden(hidden, weight, b, 0.7, chunk_size=chunk)
    assert got.dtype == torch.float32 and not got.requires_grad
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)


def test_fused_head_only_needed_grads_and_leading_dims():
    hidden, weight, b, targets = _head_inputs(n=24, bias=True)
    weight.requires_grad_(False)
    b.requires_grad_(False)
    h3, t3 = hidden.view(2, 12, -1), targets.view(2, 12)
    lp, ent = log_probs_from_hidden(h3, weight, b, t3, 1.3, chunk_size=5, with_entropy=True)
    assert lp.shape == ent.shape == (2, 12)
    (lp.sum() + ent.sum()).backward()
    assert weight.grad is None and b.grad is None
    lp_ref, ent_ref = _full(hidden.detach().requires_grad_(), weight, b, targets, 1.3, True)
    torch.testing.assert_close(lp.view(-1), lp_ref, rtol=0, atol=1e-5)


def test_fused_head_tied_embedding():
    """The head weight is also the input embedding: both uses' gradients reach it."""
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(50, 8, generator=g).requires_grad_()
    proj = torch.randn(8, 8, generator=g).requires_grad_()
    ids = torch.randint(0, 50, (20,), generator=g)
    targets = torch.randint(0, 50, (20,), generator=g)
    grads = []
    for chunk in (None, 6):
        hidden = torch.tanh(F.embedding(ids, emb) @ proj)
        lp, ent = log_probs_from_hidden(hidden, emb, None, targets, 0.9, chunk_size=chunk, with_entropy=True)
        (lp.sum() - 0.1 * ent.sum()).backward()
        grads.append(_grads(emb, proj))
    for a, r in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_fused_head_no_grad_and_empty():
    hidden, weight, b, targets = _head_inputs()
    with torch.no_grad():
        lp, ent = log_probs_from_hidden(hidden, weight, b, targets, 0.8, chunk_size=8, with_entropy=True)
        lp_ref, ent_ref = _full(hidden, weight, b, targets, 0.8, True)
    assert not lp.requires_grad and not ent.requires_grad
    lp_g, ent_g = log_probs_from_hidden(hidden, weight, b, targets, 0.8, chunk_size=8, with_entropy=True)
    assert torch.equal(lp, lp_g.detach()) and torch.equal(ent, ent_g.detach())  # same chunked math
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ent_ref, rtol=0, atol=1e-5)
    lp0, ent0 = log_probs_from_hidden(hidden[:0], weight, b, targets[:0], 0.8, chunk_size=8, with_entropy=True)
    assert lp0.shape == ent0.shape == (0,)


def test_fused_head_bf16_close_to_full():
    hidden, weight, b, targets = _head_inputs(n=40, h=32, dtype=torch.bfloat16)
    lp_ref, ent_ref = _full(hidden, weight, b, targets, 0.7, True)
    _loss(lp_ref, ent_ref, "lp+ent").backward()
    ref_grads = _grads(hidden, weight, b)
    lp, ent = log_probs_from_hidden(hidden, weight, b, targets, 0.7, chunk_size=16, with_entropy=True)
    assert lp.dtype == ent.dtype == torch.float32
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=2e-2)
    torch.testing.assert_close(ent, ent_ref, rtol=0, atol=2e-2)
    _loss(lp, ent, "lp+ent").backward()
    for name, g, r in zip(("hidden", "weight", "bias"), _grads(hidden, weight, b), ref_grads):
        assert g.dtype == torch.bfloat16 and torch.isfinite(g).all(), name
        scale = r.float().abs().max()
        assert (g.float() - r.float()).abs().max() <= 2e-2 * scale, name


def _saved_numels(fn) -> list:
    """Element counts of every tensor autograd saves while `fn` runs."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes


def test_fused_head_saves_nothing_vocab_sized():
    n, h, v = 64, 16, 300  # h < n: the weight (v*h) is smaller than the logits (n*v)
    hidden, weight, b, targets = _head_inputs(n=n, h=h, v=v)
    full = _saved_numels(lambda: _full(hidden, weight, b, targets, 0.7, True))
    assert max(full) >= n * v  # the check can see logits-sized tensors
    fused = _saved_numels(lambda: log_probs_from_hidden(hidden, weight, b, targets, 0.7, chunk_size=16,
                                                        with_entropy=True))
    assert fused and max(fused) < n * v, fused
    assert sorted(fused) == sorted([n * h, v * h, v, n, n])  # hidden, weight, bias, targets, logsumexp
    with torch.no_grad():
        assert _saved_numels(lambda: log_probs_from_hidden(hidden, weight, b, targets, 0.7, chunk_size=16,
                                                           with_entropy=True)) == []


# ================================================================ token-tiled MLP
TILE = 192  # tokens per MLP tile; the sequences below have more tokens than this
TILES = [TILE, TILE, 32]  # rows each MLP pass runs for 400 tokens: the last 16 run in a 32-row window


def _blas_sums_in_tiles(tokens: int, tile: int, dims) -> bool:
    """Whether this BLAS computes a token-reduction GEMM (as a Linear's weight gradient) as the in-order sum of
    its `tile`-token slices, bit for bit, for the given (in, out) dims. Plain torch.mm, not rlx code."""
    g = torch.Generator().manual_seed(0)
    for a, b in dims:
        x, y = torch.randn(tokens, a, generator=g), torch.randn(tokens, b, generator=g)
        acc = x[:tile].t().mm(y[:tile])
        for s in range(tile, tokens, tile):
            acc.add_(x[s:s + tile].t().mm(y[s:s + tile]))
        if not torch.equal(acc, x.t().mm(y)):
            return False
    return True


def _load(path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model.config.use_cache = False
    return model.train()


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return _load(tiny_model_path)


def _count_tiles(model) -> list:
    """Record the token count of every call of each layer's down projection."""
    seen = []
    for layer in model.model.layers:
        layer.mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].numel() // a[0].shape[-1]))
    return seen


def _ids(model, batch, seq, seed=0):
    return torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _fwd_bwd(model, ids, ctx=None):
    with ctx if ctx is not None else contextlib.nullcontext():
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logits.detach(), loss.detach(), grads


def _assert_tiled_equal(ref, got, exact_mlp_params: bool, what: str):
    """Logits, loss and every non-MLP gradient (they see the MLPs only through input gradients) bit for bit;
    MLP parameter gradients bit for bit if `exact_mlp_params`, else to float32 rounding."""
    (l0, s0, g0), (l1, s1, g1) = ref, got
    assert torch.equal(l0, l1), f"{what}: logits differ"
    assert torch.equal(s0, s1), f"{what}: loss differs"
    assert g0.keys() == g1.keys()
    for n in g0:
        if ".mlp." not in n or exact_mlp_params:
            assert torch.equal(g0[n], g1[n]), f"{what}: grad of {n} differs, max {(g0[n] - g1[n]).abs().max()}"
        else:
            torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-5 * g0[n].abs().max().item(), msg=n)


@pytest.mark.parametrize("tile,tiles", [(40, [40, 40, 40, 32]), (37, [37, 37, 37, 37, 32]), (64, [64, 64, 32])])
def test_tiled_mlp_module_rowwise_bitwise(tile, tiles):
    """One MLP, 150 tokens: output and input gradient bit for bit (a last tile under 32 rows runs in a 32-row
    window), parameter gradients to float32 rounding; with no more tokens than a tile, the original runs."""
    cfg = transformers.Qwen2Config(hidden_size=32, intermediate_size=64)
    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.mlp = transformers.models.qwen2.modeling_qwen2.Qwen2MLP(cfg)
    ref = copy.deepcopy(layer.mlp)
    x = torch.randn(3, 50, 32, requires_grad=True)
    y0 = ref(x)
    y0.square().sum().backward()
    gx0, gp0 = x.grad.clone(), [p.grad.clone() for p in ref.parameters()]
    x.grad = None
    handle = apply_tiled_mlp([layer], tile)
    sizes = []
    layer.mlp.down_proj.register_forward_pre_hook(lambda m, a: sizes.append(a[0].numel() // a[0].shape[-1]))
    y1 = layer.mlp(x)
    assert sizes == tiles
    y1.square().sum().backward()
    assert sizes == tiles * 2  # recomputed tile by tile in backward
    assert torch.equal(y0, y1) and torch.equal(gx0, x.grad)
    for p, g in zip(layer.mlp.parameters(), gp0):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-5 * g.abs().max().item())
    sizes.clear()
    with torch.no_grad():
        assert torch.equal(layer.mlp(x), y0)
    assert sizes == tiles
    sizes.clear()
    one = x.reshape(-1, 32)[:tile]
    assert torch.equal(layer.mlp(one), ref(one)) and sizes == [tile]  # one tile: the original forward
    handle.remove()
    assert "forward" not in layer.mlp.__dict__
    sizes.clear()
    layer.mlp(x)
    assert sizes == [150]
    with pytest.raises(ValueError, match="tile_tokens"):
        apply_tiled_mlp([layer], 0)


def test_tiled_mlp_saves_input_and_params_only_bf16():
    """Autograd keeps x and the parameters, no `[tokens, intermediate]` tensor; bfloat16 works (parameter
    gradients summed in float32, returned in bfloat16) and stays close to the untiled MLP."""
    cfg = transformers.Qwen2Config(hidden_size=32, intermediate_size=64)
    torch.manual_seed(1)
    layer = torch.nn.Module()
    layer.mlp = transformers.models.qwen2.modeling_qwen2.Qwen2MLP(cfg).to(torch.bfloat16)
    ref = copy.deepcopy(layer.mlp)
    x = torch.randn(2, 100, 32, dtype=torch.bfloat16, requires_grad=True)
    untiled = _saved_numels(lambda: ref(x))
    assert max(untiled) == 200 * 64
    y0 = ref(x)
    y0.float().square().sum().backward()
    gx0, gp0 = x.grad.clone(), [p.grad.clone() for p in ref.parameters()]
    x.grad = None
    apply_tiled_mlp([layer], 48)
    saved = _saved_numels(lambda: layer.mlp(x))
    assert sorted(saved) == sorted([x.numel()] + [p.numel() for p in layer.mlp.parameters()])
    y1 = layer.mlp(x)
    y1.float().square().sum().backward()
    assert torch.equal(y0, y1)
    for got, want in [(x.grad, gx0)] + [(p.grad, g) for p, g in zip(layer.mlp.parameters(), gp0)]:
        assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
        assert (got.float() - want.float()).abs().max() <= 2e-2 * want.float().abs().max()


@pytest.mark.parametrize("mode", ["plain", "checkpoint", "offload", "offload_ckpt"])
def test_tiled_mlp_model_bitwise(tiny, mode):
    from rlx.offload import ActivationOffloadConfig, apply_activation_offload, find_decoder_layers

    ref, m = copy.deepcopy(tiny), copy.deepcopy(tiny)
    batch, seq = 2, 200  # 400 tokens
    exact = _blas_sums_in_tiles(batch * seq, TILE, [(m.config.hidden_size, m.config.intermediate_size),
                                                    (m.config.intermediate_size, m.config.hidden_size)])
    handle = apply_tiled_mlp(find_decoder_layers(m), TILE)
    off = None
    if mode == "checkpoint":
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif mode.startswith("offload"):
        off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False),
                                       enable_gradient_checkpointing=mode == "offload_ckpt")
    seen = _count_tiles(m)
    n_layers = len(m.model.layers)
    for step in range(2):
        ids = _ids(m, batch, seq, seed=step)
        seen.clear()
        got = _fwd_bwd(m, ids, off.activate() if off is not None else None)
        _assert_tiled_equal(_fwd_bwd(ref, ids), got, exact, mode)
        # each layer's MLP: forward, (the checkpoint's recompute,) the backward's recompute; TILES each
        passes = 3 if mode in ("checkpoint", "offload_ckpt") else 2
        assert sorted(seen) == sorted(TILES * passes * n_layers), seen
    if off is not None:
        assert off.stats()["offloaded_bytes_last_step"] > 0
    seen.clear()
    m.eval(), ref.eval()
    with torch.no_grad():  # eval forward: tiled too, same logits
        assert torch.equal(m(input_ids=ids).logits, ref(input_ids=ids).logits)
    assert max(seen) == TILE
    handle.remove()
    assert all("forward" not in layer.mlp.__dict__ for layer in m.model.layers)


def test_tiled_mlp_short_sequence_untouched(tiny):
    ref, m = copy.deepcopy(tiny), copy.deepcopy(tiny)
    apply_tiled_mlp(list(m.model.layers), TILE)
    seen = _count_tiles(m)
    ids = _ids(m, 2, 40)
    _assert_tiled_equal(_fwd_bwd(ref, ids), _fwd_bwd(m, ids), True, "short")
    assert seen == [80] * len(m.model.layers)  # one untiled forward per layer


# ---------------------------------------------------------------- FSDP1 / FSDP2 over gloo, world size 2
def _wrap(model, strategy: str):
    if strategy == "fsdp1":  # as the engine wraps it: one unit per decoder layer, use_orig_params=True
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({type(model.model.layers[0])}),
                    device_id=torch.device("cpu"), use_orig_params=True)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp_train(path, strategy: str, tiled: bool, ckpt: bool, steps: int = 2):
    from rlx.offload import find_decoder_layers
    model = _load(path)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = _wrap(model, strategy)
    seen = []
    if tiled:
        layers = find_decoder_layers(model)
        apply_tiled_mlp(layers, TILE)
        for layer in layers:
            layer.mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].numel() // a[0].shape[-1]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rank = torch.distributed.get_rank()
    losses, grads = [], []
    for step in range(steps):
        ids = torch.randint(0, 259, (2, 200), generator=torch.Generator().manual_seed(100 * step + rank))
        loss = F.cross_entropy(model(input_ids=ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        losses.append(loss.item())
        grads.append({n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
                      for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = [(p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in model.parameters()]
    return losses, grads, params, seen


def _fsdp_worker(rank: int, world: int, port: int, path: str):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    try:
        exact = _blas_sums_in_tiles(400, TILE, [(128, 256), (256, 128)])
        for strategy in ("fsdp1", "fsdp2"):
            ref = _fsdp_train(path, strategy, tiled=False, ckpt=False)
            for ckpt in (False, True):
                got = _fsdp_train(path, strategy, tiled=True, ckpt=ckpt)
                what = f"{strategy} tiled{' + checkpoint' if ckpt else ''}"
                assert got[3] and sorted(set(got[3])) == [32, TILE], what  # tiling happened
                # not exact: the first step's MLP grads differ by rounding, then the AdamW steps diverge
                steps = len(ref[0]) if exact else 1
                assert ref[0][:steps] == got[0][:steps], f"{what}: losses {ref[0]} vs {got[0]}"
                for step, (g0, g1) in enumerate(zip(ref[1][:steps], got[1][:steps])):
                    assert g0.keys() == g1.keys() and g0, what
                    for n in g0:
                        if exact or ".mlp." not in n:
                            assert torch.equal(g0[n], g1[n]), f"{what}: step {step} grad {n} differs"
                        else:
                            torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-5 * g0[n].abs().max())
                if exact:
                    assert all(torch.equal(a, b) for a, b in zip(ref[2], got[2])), f"{what}: params differ"
    finally:
        end_rank()


# ================================================================ CUDA: same results, lower peak (pytest -m gpu)
def _peak(fn) -> int:
    """Peak CUDA bytes allocated while `fn` runs, above what was allocated before."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base
