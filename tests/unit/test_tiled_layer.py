"""CPU tests of rlx.ops.tiled_layer: token-tiled decoder layers against the untiled HF model (transformers 5.x
Qwen2 layers, float32): plain, with activation offload + checkpointing (the layers are their own checkpoint and
only their inputs are offloaded), the critic's token classifier, packed rows (remove padding: position_ids
restarting, per-sequence attention), bfloat16, FSDP1/FSDP2 over gloo; and the host pool sized before the first
step.

Exactness: logits/values and the gradient of the layers' input (the embeddings) bit for bit; every parameter
outside the layers bit for bit (it sees the layers only through those); the layers' own parameter gradients are
sums over tiles (so is the final norm's weight), equal up to float32 summation order (see tests/unit/test_ops.py on BLAS K-blocks).
"""
from __future__ import annotations

import copy
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from ranks import end_rank
from rlx.ops import apply_tiled_layers


TILE = 96  # tokens per layer tile; 2 x 150 = 300 tokens: tiles 96, 96, 96 and a 12-token tile in a 32-row window


def _load(path, critic=False):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(path)
    if critic:  # as the engine builds the critic
        config.num_labels, config.classifier_dropout = 1, 0.0
    cls = AutoModelForTokenClassification if critic else AutoModelForCausalLM
    model = cls.from_pretrained(path, config=config, dtype=torch.float32, attn_implementation="sdpa")
    model.config.use_cache = False
    return model.train()


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return _load(tiny_model_path)


def _count_pre(model) -> list:
    """Token count of every q_proj call (the tiles of the pre part)."""
    seen = []
    for layer in model.base_model.layers:
        layer.self_attn.q_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].numel() // a[0].shape[-1]))
    return seen


def _run(model, ids, ctx=None, **kw):
    """Logits (or values) and every gradient, the layers' input (the embeddings) as a leaf."""
    emb = model.base_model.embed_tokens(ids).detach().requires_grad_()
    with ctx if ctx is not None else torch.enable_grad():
        out = model(inputs_embeds=emb, **kw).logits
        g = torch.Generator().manual_seed(5)
        loss = (out * torch.randn(out.shape, generator=g)).sum()
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), emb.grad, grads


def _assert_equal(ref, got, what):
    (o0, x0, g0), (o1, x1, g1) = ref, got
    assert torch.equal(o0, o1), f"{what}: outputs differ by {(o0 - o1).abs().max()}"
    assert torch.equal(x0, x1), f"{what}: input gradients differ by {(x0 - x1).abs().max()}"
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        if ".layers." in n or ".norm." in n:  # the layers' and the final norm's: summed over tiles
            torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-5 * g0[n].abs().max().item(), msg=n)
        else:
            assert torch.equal(g0[n], g1[n]), f"{what}: grad of {n} differs by {(g0[n] - g1[n]).abs().max()}"


def _count_reuse(monkeypatch) -> list:
    """One entry per tiled layer backward: whether its incoming gradient became its dx in place."""
    import rlx.ops.tiled_layer as tl
    hits, orig = [], tl.is_exclusive
    monkeypatch.setattr(tl, "is_exclusive", lambda t: hits.append(orig(t)) or hits[-1])
    return hits


@pytest.mark.parametrize("mode", ["plain", "offload_ckpt", "critic", "packed"])
def test_tiled_layers_bitwise(tiny, tiny_model_path, mode, monkeypatch):
    from rlx.offload import ActivationOffloadConfig, apply_activation_offload, find_decoder_layers

    base = _load(tiny_model_path, critic=True) if mode == "critic" else tiny
    ref, m = copy.deepcopy(base), copy.deepcopy(base)
    handle = apply_tiled_layers(find_decoder_layers(m), TILE, final_norm=m.base_model.norm)
    off = None
    if mode == "offload_ckpt":
        off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False),
                                       enable_gradient_checkpointing=True, recomputed=handle.layers)
    seen = _count_pre(m)
    reused = _count_reuse(monkeypatch)
    n_layers = len(handle.layers)
    kw = {}
    if mode == "packed":  # one row of two sequences (150 + 150 tokens): position_ids restart, attention per sequence
        from rlx.engine.attention import PACKED_SDPA, register_packed_attention
        register_packed_attention()
        for x in (ref, m):
            x.config._attn_implementation = PACKED_SDPA
        batch, seq = 1, 300
        cu = torch.tensor([0, 150, 300], dtype=torch.int32)
        kw = dict(position_ids=torch.cat([torch.arange(150), torch.arange(150)])[None],
                  cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=150, max_length_k=150)
    else:
        batch, seq = 2, 150
    for step in range(2):
        ids = torch.randint(0, m.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(step))
        seen.clear()
        reused.clear()
        got = _run(m, ids, off.activate() if off is not None else None, **kw)
        _assert_equal(_run(ref, ids, **kw), got, mode)
        # every layer's incoming gradient came from the tiled layer or final norm above: its dx in place
        assert reused == [True] * n_layers, reused
        # each layer: forward's tiles, then backward's q/k/v without grad and the tiles differentiated
        assert sorted(seen) == sorted([96, 96, 96, 32] * 3 * n_layers), seen
    if off is not None:
        st = off.stats()
        # one group per layer (its input) plus the final norm's and the output projection's inputs (offload_head):
        # nothing else of a layer leaves the device
        assert st["offloaded_bytes_last_step"] == (n_layers + 2) * batch * seq * m.config.hidden_size * 4, st
    m.eval(), ref.eval()
    with torch.no_grad():  # eval forward: tiled too, same outputs
        ids = torch.randint(0, m.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(9))
        assert torch.equal(m(input_ids=ids, **kw).logits, ref(input_ids=ids, **kw).logits)
    handle.remove()
    assert all("forward" not in layer.__dict__ for layer in m.base_model.layers)
    assert "forward" not in m.base_model.norm.__dict__


def test_tiled_layer_hands_down_only_exclusive_gradients(tiny, monkeypatch):
    """A layer's gradient is reused in place only when nothing else can hold it: after the loss (not handed
    down by a tiled function) or through a node that fans it out (`y + y`), a fresh buffer is used."""
    ref = copy.deepcopy(tiny)
    m = copy.deepcopy(tiny)
    apply_tiled_layers(list(m.model.layers[:2]), 64)
    reused = _count_reuse(monkeypatch)
    pos = torch.arange(100)[None].expand(2, -1)
    for fan_out in (False, True):
        grads = []
        for model in (ref, m):
            l1, l2 = model.model.layers[:2]
            x = torch.randn(2, 100, m.config.hidden_size, generator=torch.Generator().manual_seed(0),
                            requires_grad=True)
            pe = m.model.rotary_emb(x, pos)
            y = l1(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
            z = l2(y + y if fan_out else y, attention_mask=None, position_ids=pos, position_embeddings=pe)
            (z * torch.randn(z.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
            grads.append(x.grad)
        assert torch.equal(grads[0], grads[1]), fan_out
        assert reused == ([False, False] if fan_out else [False, True]), (fan_out, reused)
        reused.clear()


def test_tiled_layer_saves_input_and_params_only(tiny):
    """Autograd keeps the layer input and the parameters; nothing else of the layer, nothing whole."""
    m = copy.deepcopy(tiny)
    layer = m.model.layers[0]
    apply_tiled_layers([layer], 64)
    x = torch.randn(2, 100, m.config.hidden_size, requires_grad=True)
    pos = torch.arange(100)[None].expand(2, -1)
    pe = m.model.rotary_emb(x, pos)
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
    assert sorted(sizes) == sorted([x.numel()] + [p.numel() for p in layer.parameters()])


def test_tiled_layers_bf16_close(tiny):
    ref = copy.deepcopy(tiny).to(torch.bfloat16)
    m = copy.deepcopy(ref)
    apply_tiled_layers(list(m.model.layers), 64, final_norm=m.model.norm)
    ids = torch.randint(0, m.config.vocab_size, (2, 150), generator=torch.Generator().manual_seed(0))
    (o0, x0, g0), (o1, x1, g1) = _run(ref, ids), _run(m, ids)
    assert torch.equal(o0, o1)  # forward: the same ops on the same rows
    assert (x1.float() - x0.float()).abs().max() <= 2e-2 * x0.float().abs().max()
    for n in g0:
        assert g1[n].dtype == torch.bfloat16 and torch.isfinite(g1[n]).all(), n
        assert (g1[n].float() - g0[n].float()).abs().max() <= 3e-2 * g0[n].float().abs().max(), n


def test_tiled_layers_refuses_what_it_cannot_tile(tiny):
    m = copy.deepcopy(tiny)
    with pytest.raises(ValueError, match="tile_layer_tokens"):
        apply_tiled_layers(list(m.model.layers), 0)
    m.model.layers[0].self_attn.q_norm = torch.nn.LayerNorm(8)  # Qwen3-style per-head norm: not this layout
    with pytest.raises(ValueError, match="tile_layer_tokens=0"):
        apply_tiled_layers(list(m.model.layers), 64)
    m2 = copy.deepcopy(tiny)
    m2.model.layers[1].self_attn.attention_dropout = 0.1
    with pytest.raises(ValueError, match="attention_dropout"):
        apply_tiled_layers(list(m2.model.layers), 64)


# ---------------------------------------------------------------- the host pool, sized before the first step
def test_pool_reserved_before_first_step(tiny):
    from rlx.offload import ActivationOffloadConfig, apply_activation_offload
    from conftest import load_config
    from rlx.engine.base import micro_batch_tokens, role_micro_batch_tokens

    assert micro_batch_tokens(100, 200, 2, None) == 600 and micro_batch_tokens(100, 200, 2, 4096) == 4096
    cfg = load_config(["data.max_prompt_length=100", "data.max_response_length=200",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                       "critic.use_dynamic_bsz=True", "critic.ppo_max_token_len_per_gpu=4096"])
    assert role_micro_batch_tokens(cfg.data, cfg.actor_rollout_ref.actor) == 600  # what the workers reserve for
    assert role_micro_batch_tokens(cfg.data, cfg.critic) == 4096
    h = tiny.config.hidden_size
    for reserve, ckpt in ((True, True), (False, True), (True, False)):
        m = copy.deepcopy(tiny)
        off = apply_activation_offload(m, ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False,
                                                                  pool_chunk_bytes=1 << 20, reserve_pool=reserve),
                                       enable_gradient_checkpointing=ckpt)
        tokens = 2 * 300
        added = off.reserve_pool(tokens, h, torch.float32)
        if not (reserve and ckpt):
            assert added == 0 and off.pool.capacity == 0
            continue
        need = (len(m.model.layers) + 2) * tokens * h * 4  # layer inputs + the head's two (offload_head)
        assert added == off.pool.capacity >= need and off.pool.n_chunk_allocs == 1  # < 1 GiB: one chunk
        ids = torch.randint(0, m.config.vocab_size, (2, 300), generator=torch.Generator().manual_seed(0))
        _run(m, ids, off.activate())
        st = off.stats()
        assert st["pool_chunk_allocs"] == 1 and st["pool_bytes"] == added, st  # the first step grew nothing
        assert 0 < st["pool_peak_used_bytes"] <= added
        assert off.reserve_pool(tokens, h, torch.float32) == 0  # already that large
    from rlx.offload.pool import HostPool
    pool = HostPool(1 << 20, pin_memory=False, max_bytes=3 << 20)
    assert pool.reserve(10 << 20) == 3 << 20 and pool.capacity == 3 << 20  # the bound holds
    import rlx.offload.pool as pool_mod
    big = HostPool(1 << 20, pin_memory=False)
    pool_mod._GiB, saved = 8 << 20, pool_mod._GiB  # chunks of ~8 MiB instead of 1 GiB, to test it small
    try:
        piece = 3 << 20  # 3 MiB requests: chunks of two whole pieces (6 MiB), never one split across chunks
        assert big.reserve(5 * piece, piece) == 16 << 20  # 15 MiB rounded up to 2 MiB
        assert [c.numel() for c in big.chunks] == [6 << 20, 6 << 20, 4 << 20]
        got = [big.allocate(piece) for _ in range(5)]
        assert all(t is not None and t.numel() == piece for t in got) and big.n_chunk_allocs == 3
    finally:
        pool_mod._GiB = saved


# ---------------------------------------------------------------- FSDP1 / FSDP2 over gloo, world size 2
def _fsdp_train(path, strategy: str, tiled: bool, critic: bool):
    from rlx.offload import ActivationOffloadConfig, apply_activation_offload, find_decoder_layers
    from unit.test_ops import _wrap

    torch.manual_seed(0)  # the critic's value head is initialised at load: the same in both runs
    model = _load(path, critic=critic)
    recomputed = []
    if tiled:
        recomputed = apply_tiled_layers(find_decoder_layers(model), TILE, final_norm=model.base_model.norm).layers
    model = _wrap(model, strategy)
    off = apply_activation_offload(model, ActivationOffloadConfig(min_tensor_bytes=0, pin_memory=False),
                                   enable_gradient_checkpointing=True, recomputed=recomputed)
    rank = torch.distributed.get_rank()
    ids = torch.randint(0, 259, (2, 150), generator=torch.Generator().manual_seed(rank))
    with off.activate():
        out = model(input_ids=ids).logits
        loss = (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(7))).sum()
        loss.backward()
    return out.detach(), {n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
                          for n, p in model.named_parameters() if p.grad is not None}


def _fsdp_worker(rank: int, world: int, port: int, path: str):
    import rlx.ops.tiled_layer as tl
    hits, orig = [], tl.is_exclusive
    tl.is_exclusive = lambda t: hits.append(orig(t)) or hits[-1]  # this spawned process only
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    try:
        for strategy, critic in (("fsdp1", False), ("fsdp2", False), ("fsdp2", True)):
            what = f"{strategy}{' critic' if critic else ''}, offload + ckpt"
            o0, g0 = _fsdp_train(path, strategy, False, critic)
            hits.clear()
            o1, g1 = _fsdp_train(path, strategy, True, critic)
            assert hits == [True] * 4, (what, hits)  # through FSDP's hooks too: dx in place
            assert torch.equal(o0, o1), what
            assert g0.keys() == g1.keys() and g0, what
            for n in g0:  # sharded gradients: a layer's shard is a sum over tiles (and ranks)
                if ".layers." in n or ".norm." in n:
                    torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-5 * g0[n].abs().max(), msg=n)
                else:
                    assert torch.equal(g0[n], g1[n]), f"{what}: grad {n} differs"
    finally:
        end_rank()


# ---------------------------------------------------------------- the breakdown's census (benchmarks/memory_census.py)
def test_memory_census_per_token_classes():
    """y = exp(2 a) over n tokens of 256 float32: forward leaves exp's output for backward (1.024 KB per token);
    backward allocates exp's and mul's gradients on top; a's own storage was made outside and is not counted."""
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(repo, "benchmarks"))
    from memory_census import MemoryCensus, marginal

    runs = []
    for n in (1000, 3000):
        a = torch.randn(n, 256, requires_grad=True)
        census = MemoryCensus()
        with census:
            y = (a * 2).exp()
            y.sum().backward()
        del y
        runs.append(census.summary(n))
        assert census.total == n * 256 * 4  # freed storages are forgotten: only a.grad is still alive
    m = marginal(*runs)
    rows = {r["cls"]: r for r in m["rows"]}
    exp = [r for c, r in rows.items() if c.startswith("fwd") and "| exp |" in c]
    assert len(exp) == 1 and exp[0]["backward_start_kb"] == pytest.approx(1.024), rows
    assert m["backward_start_kb"] == pytest.approx(1.024)  # the mul's output was freed before backward
    assert any(c.startswith("bwd") for c in rows) and m["peak_kb"] >= 2 * 1.024, rows
    # an optimizer step's allocations are followed (freed storages forgotten) but do not move the peak
    p = torch.nn.Parameter(torch.zeros(4000, 256))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    census = MemoryCensus()
    with census:
        p.grad = torch.ones_like(p)  # 4 MB: the peak so far
        opt.step()  # allocates the 4 MB momentum buffer, which stays
    assert census.peak == 4000 * 256 * 4 and census.frozen
    assert census.total == 2 * 4000 * 256 * 4
