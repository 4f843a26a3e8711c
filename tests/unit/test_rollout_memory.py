"""The rollout and memory keys (docs/rollout_memory.md): rollout.layered_summon (one FSDP unit gathered at a time,
the same merged weights), model.use_shm / data.use_shm (loaded from a copy in shared memory), the unfused head's
entropy_from_logits_with_chunking / entropy_checkpointing (the same values and gradients), and the config of the
keys that are accepted without changing anything (multi_stage_wake_up, checkpoint_engine's bucket size)."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from conftest import load_config

WORLD = 2


# ---- layered_summon: the same weights, at most one FSDP unit unsharded at a time ---------------------------------
def _engine(strategy: str, lora: bool):
    from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig, OptimConfig
    from rlx.engine.actor import ActorEngine

    kw = dict(lora_rank=4, lora_alpha=8) if lora else {}
    model_cfg = ModelConfig(path="builtin://tiny-qwen2", use_remove_padding=False,
                            enable_gradient_checkpointing=False, **kw)
    actor_cfg = ActorConfig(strategy=strategy, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                            optim=OptimConfig(lr=1e-2))
    return ActorEngine(role="actor", model_cfg=model_cfg, actor_cfg=actor_cfg, fsdp_cfg=FSDPConfig(), strategy=strategy,
                       device=torch.device("cpu"), world_size=WORLD, rollout_n=1, temperature=1.0, total_steps=4)


def _train_once(engine, rank: int):
    """One update, so that LoRA's B is no longer zero (the merged weights differ from the base)."""
    from rlx.protocol import Batch

    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(3, 259, (2, 12), generator=g)
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                   "position_ids": torch.arange(12).expand(2, -1).clone(), "responses": ids[:, 4:],
                   "response_mask": torch.ones(2, 8), "advantages": torch.randn(2, 8, generator=g)})
    lp = engine.compute_log_prob(batch, 2)["log_probs"]
    engine.update_policy(batch.union(Batch({"old_log_probs": lp - 0.1})))


def _unsharded_units(module) -> int:
    """FSDP1 units whose full (padded) flat parameter is allocated now."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    n = 0
    for m in module.modules():
        if isinstance(m, FSDP) and m._handle is not None:
            full = getattr(m._handle.flat_param, "_full_param_padded", None)
            n += int(full is not None and full.untyped_storage().size() > 0)
    return n


def _check_layered(rank: int, strategy: str, root: str):
    from rlx.engine.weights import iter_full_params

    for lora in (True, False):
        engine = _engine(strategy, lora)
        _train_once(engine, rank)
        with engine.phase():
            whole, peak_whole = {}, 0
            for k, v in engine.policy_weights():
                whole[k] = v.clone()
                peak_whole = max(peak_whole, _unsharded_units(engine.module))
            layered, peak_layered = {}, 0
            for k, v in engine.policy_weights(layered=True):
                layered[k] = v.clone()
                peak_layered = max(peak_layered, _unsharded_units(engine.module))
            raw = {k: v.clone() for k, v in iter_full_params(engine.module)}  # base_layer / lora_A / lora_B names
        plain_names = {k.replace(".base_layer", "") for k in raw if "lora_" not in k}
        assert set(whole) == set(layered) == plain_names, (set(whole) ^ set(layered), set(whole) ^ plain_names)
        for k in whole:
            assert torch.equal(whole[k], layered[k]), f"lora={lora}: {k} differs"
        if lora:  # trained adapters: the merged projections are not the base's
            q = "model.layers.0.self_attn.q_proj"
            assert not torch.equal(whole[f"{q}.weight"], raw[f"{q}.base_layer.weight"])
        if strategy == "fsdp":  # 4 decoder layers + the root: the whole-model summon unshards all 5 at once
            assert (peak_whole, peak_layered) == (5, 1), (peak_whole, peak_layered)


# ---- the unfused head's entropy keys ----------------------------------------------------------------------------
def _head_case(seed=0, n=37, h=16, v=300):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = (torch.randn(v, h, generator=g) * 0.3).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk,ckpt", [(None, True), (5, False), (5, True), (2048, True)])
def test_unfused_entropy_chunking_and_checkpointing_same_values_and_grads(chunk, ckpt):
    from rlx.ops.log_prob_head import log_probs_from_hidden

    def run(**kw):
        hidden, weight, targets = _head_case()
        lp, ent = log_probs_from_hidden(hidden, weight, None, targets, 0.7, chunk_size=None, with_entropy=True, **kw)
        loss = (lp * torch.linspace(-1, 1, lp.numel())).sum() - 0.3 * (ent * torch.linspace(1, 2, ent.numel())).sum()
        loss.backward()
        return lp.detach(), ent.detach(), hidden.grad, weight.grad

    ref = run()
    got = run(entropy_chunk_size=chunk, entropy_checkpointing=ckpt)
    for a, b, what in zip(ref, got, ("log_probs", "entropy", "grad hidden", "grad weight")):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (what, (a - b).abs().max())
    # the entropy by hand for one row: H = -sum p log p of softmax(h W^T / T)
    hidden, weight, _ = _head_case()
    p = torch.softmax(hidden[3].detach() @ weight.detach().t() / 0.7, dim=-1)
    assert torch.allclose(got[1][3], -(p * p.log()).sum(), atol=1e-5)


def test_entropy_checkpointing_saves_only_the_logits():
    """With checkpointing, the entropy's backward keeps no [N, V] float32 intermediates besides the logits."""
    from rlx.ops.log_prob_head import _entropy

    def saved_bytes(ckpt: bool) -> int:
        total = []

        def pack(t):
            total.append(t.numel() * t.element_size())
            return t

        logits = torch.randn(64, 1000, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _entropy(logits, None, ckpt).sum().backward()
        return sum(total)

    full = 64 * 1000 * 4
    assert saved_bytes(False) >= 2 * full  # softmax and its products are kept
    assert saved_bytes(True) <= full + 64 * 8  # the logits (and row-sized tensors) only


def test_entropy_keys_reach_the_engines_head(monkeypatch):
    """actor.* configures the actor's unfused head, ref.* the ref's; the fused head ignores both."""
    from rlx.engine import heads

    seen = []
    real = heads.apply_token_head

    def spy(model, role, chunk_size, **kw):
        seen.append((role, chunk_size, kw))
        return real(model, role, chunk_size, **kw)

    monkeypatch.setattr("rlx.engine.base.apply_token_head", spy)
    from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig, RefConfig
    from rlx.engine.actor import ActorEngine

    common = dict(fsdp_cfg=FSDPConfig(), strategy="fsdp2", device=torch.device("cpu"), world_size=1, rollout_n=1,
                  temperature=1.0)
    actor = ActorConfig(entropy_from_logits_with_chunking=True, entropy_from_logits_chunk_size=64,
                        entropy_checkpointing=True)
    ref = RefConfig(entropy_from_logits_with_chunking=False, entropy_checkpointing=True)
    import torch.distributed as dist

    from conftest import free_port
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        unfused = ModelConfig(path="builtin://tiny-qwen2", use_fused_kernels=False)
        ActorEngine(role="actor", model_cfg=unfused, actor_cfg=actor, **common)
        ActorEngine(role="ref", model_cfg=unfused, actor_cfg=actor, entropy_cfg=ref, **common)
        ActorEngine(role="actor", model_cfg=ModelConfig(path="builtin://tiny-qwen2"), actor_cfg=actor, **common)
    finally:
        dist.destroy_process_group()
    assert seen[0] == ("actor", None, dict(entropy_chunk_size=64, entropy_checkpointing=True, backend="torch"))
    assert seen[1] == ("ref", None, dict(entropy_chunk_size=None, entropy_checkpointing=True, backend="torch"))
    assert seen[2][1] == 2048  # fused: the head's own chunks (it computes the entropy chunk by chunk anyway)


# ---- use_shm ------------------------------------------------------------------------------------------------------
def test_copy_to_shm_once_and_fresh_after_a_change(tmp_path):
    from rlx.models.shm import copy_to_shm

    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text('{"a": 1}')
    (src / "sub").mkdir()
    (src / "sub" / "w.bin").write_bytes(b"\x00\x01" * 100)
    shm = tmp_path / "shm"
    shm.mkdir()
    dst = copy_to_shm(str(src), root=str(shm))
    assert dst.startswith(str(shm)) and os.path.basename(dst) == "model"
    assert open(os.path.join(dst, "config.json")).read() == '{"a": 1}'
    assert open(os.path.join(dst, "sub", "w.bin"), "rb").read() == b"\x00\x01" * 100
    assert copy_to_shm(str(src), root=str(shm)) == dst  # reused
    (src / "config.json").write_text('{"a": 2}')  # a changed source is copied afresh
    dst2 = copy_to_shm(str(src), root=str(shm))
    assert dst2 != dst and open(os.path.join(dst2, "config.json")).read() == '{"a": 2}'
    f = copy_to_shm(str(src / "config.json"), root=str(shm))  # a single file
    assert open(f).read() == '{"a": 2}'
    with pytest.raises(ValueError, match=r"data.use_shm=True: .* does not exist"):
        copy_to_shm(str(tmp_path / "missing"), key="data.use_shm", root=str(shm))
    with pytest.raises(ValueError, match="not available"):
        copy_to_shm(str(src), root=str(tmp_path / "no-shm"))


def test_use_shm_loads_the_model_and_data_from_dev_shm(tmp_path, monkeypatch):
    """model.use_shm: the engine's HF model is read from the copy under /dev/shm; data.use_shm: the parquet too."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    import shutil

    from rlx.engine import fsdp as F
    from rlx.models import local_model_path, resolve_model_path

    model_src = tmp_path / "tiny"
    shutil.copytree(resolve_model_path("builtin://tiny-qwen2"), model_src)
    loaded = []
    real = F.build_hf_model
    monkeypatch.setattr(F, "build_hf_model", lambda path, *a, **k: loaded.append(path) or real(path, *a, **k))
    try:
        path = local_model_path(str(model_src), use_shm=True)
        assert path.startswith("/dev/shm/") and os.path.isfile(os.path.join(path, "config.json"))
        assert local_model_path(str(model_src), use_shm=False) == str(model_src)
        import torch.distributed as dist

        from conftest import free_port
        from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig
        from rlx.engine.actor import ActorEngine

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        try:
            ActorEngine(role="actor", model_cfg=ModelConfig(path=str(model_src), use_shm=True),
                        actor_cfg=ActorConfig(), fsdp_cfg=FSDPConfig(), strategy="fsdp2", device=torch.device("cpu"),
                        world_size=1, rollout_n=1, temperature=1.0)
        finally:
            dist.destroy_process_group()
        assert loaded == [path]

        # data.use_shm: the dataset reads the parquet's copy
        import pandas as pd
        from transformers import AutoTokenizer

        from rlx.config.schema import DataConfig
        from rlx.data import dataset as D

        pq = tmp_path / "train.parquet"
        pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]], "data_source": ["x"],
                      "reward_model": [{"ground_truth": "2"}]}).to_parquet(pq)
        read = []
        real_read = D._read_parquet
        monkeypatch.setattr(D, "_read_parquet", lambda p, req: read.append(p) or real_read(p, req))
        tok = AutoTokenizer.from_pretrained(path)
        ds = D.RLDataset([str(pq)], tok, DataConfig(max_prompt_length=64, use_shm=True))
        assert len(ds) == 1 and read[0].startswith("/dev/shm/") and read[0].endswith("train.parquet")
    finally:  # the copies in /dev/shm and their lock files
        for p in [locals().get("path")] + list(locals().get("read", [])):
            if p and p.startswith("/dev/shm/"):
                shutil.rmtree(os.path.dirname(p), ignore_errors=True)
                if os.path.exists(os.path.dirname(p) + ".lock"):
                    os.remove(os.path.dirname(p) + ".lock")


# ---- config ---------------------------------------------------------------------------------------------------------
def test_keys_accepted_and_refused():
    cfg = load_config(["actor_rollout_ref.rollout.layered_summon=True", "actor_rollout_ref.model.use_shm=True",
                       "data.use_shm=True", "critic.model.use_shm=True",
                       "actor_rollout_ref.rollout.multi_stage_wake_up=True",
                       "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=512",
                       "actor_rollout_ref.actor.entropy_checkpointing=True",
                       "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
                       "actor_rollout_ref.ref.entropy_checkpointing=True"])
    assert cfg.actor_rollout_ref.rollout.layered_summon and cfg.actor_rollout_ref.model.use_shm
    with pytest.raises(ValueError, match=r"checkpoint_engine.backend.*nccl"):
        load_config(["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"])


def test_entropy_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.entropy_from_logits_chunk_size=0 must be a positive"):
        load_config(["actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
                     "actor_rollout_ref.actor.entropy_from_logits_chunk_size=0"])
    load_config(["actor_rollout_ref.actor.entropy_from_logits_chunk_size=0"])  # not read without chunking
