"""Hybrid sharding (verl's `fsdp_config.fsdp_size`) on 4 CPU ranks over gloo, FSDP1 and FSDP2 (fp32, the builtin
tiny Qwen2).

fsdp_size=2 is 2 replicas of 2 consecutive ranks: the model is sharded inside a replica (each rank holds 1/2 of a
parameter, not 1/4) and the gradients are averaged over all 4 ranks. The same global batch, split over the same 4
ranks, gives the actor's and the critic's outputs, losses and every parameter gradient of fsdp_size=-1; with
Ulysses sp=2 on top (sequence-parallel pairs inside each replica) too. A checkpoint saved under hybrid sharding
resumes exactly under it and loads into a fully sharded engine.
"""
from __future__ import annotations

import os

import pytest
import torch

from unit.test_batch_shaping import _capture_grads, lengths_batch

WORLD = 4
HSDP = ["actor_rollout_ref.actor.fsdp_config.fsdp_size=2", "critic.model.fsdp_config.fsdp_size=2"]
TOL = 1e-6


def _sharding(engine) -> tuple:
    """(mesh shape, ranks holding a parameter's shard) as this rank sees its first decoder layer."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(engine.module, FSDP):
        units = [m for m in FSDP.fsdp_modules(engine.module) if m is not engine.module]
        pg = units[0].process_group  # FSDP1 HYBRID_SHARD: the shard group (the replicate group is the other)
        return units[0].sharding_strategy.name, torch.distributed.get_world_size(pg)
    p = next(p for n, p in engine.module.named_parameters() if "layers.0." in n)
    return tuple(p.device_mesh.shape), p.device_mesh.mesh_dim_names


def _run(strategy, over, sp, batch):
    """Outputs, gradients and losses of the actor and the critic; this rank's rows are its data-parallel group's."""
    from unit.test_ulysses import _engines

    rank = torch.distributed.get_rank()
    rows = batch.chunk(WORLD // sp)[rank // sp]
    actor, critic = _engines(strategy, over, sp, WORLD, torch.device("cpu"))
    shard = (_sharding(actor), _sharding(critic))
    out = dict(actor.compute_log_prob(rows, 3, with_entropy=True).tensors)
    out["values"] = critic.compute_values(rows)["values"]
    g_actor, g_critic = _capture_grads(actor), _capture_grads(critic)
    m_actor, m_critic = actor.update_policy(rows), critic.update_critic(rows)
    losses = {k: m_actor[k] for k in ("actor/pg_loss", "actor/entropy", "actor/kl_loss")}
    losses["critic/vf_loss"] = m_critic["critic/vf_loss"]
    return out, g_actor, g_critic, losses, shard


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()


def _exactness(rank, strategy, root):
    from unit.test_ulysses import BATCH

    batch = lengths_batch(**BATCH)
    ref = _run(strategy, [], 1, batch)
    expected_shard = ("FULL_SHARD", 4) if strategy == "fsdp" else ((4,), None)
    assert ref[4] == (expected_shard, expected_shard), ref[4]
    worst = {}
    for name, over, sp in (("hsdp", HSDP, 1), ("hsdp+sp2", HSDP, 2)):
        got = _run(strategy, over, sp, batch)
        hybrid = ("HYBRID_SHARD", 2) if strategy == "fsdp" else ((2, 2), ("replicate", "shard"))
        assert got[4] == (hybrid, hybrid), (name, got[4])  # the model really is sharded over 2 ranks, twice
        w = {}
        if sp == 1:  # the same rows on every rank: the same outputs
            for k in ref[0]:
                w[k] = _rel(got[0][k], ref[0][k])
        for what, a, b in (("actor grads", got[1], ref[1]), ("critic grads", got[2], ref[2])):
            assert a.keys() == b.keys() and a, what
            w[what] = max(_rel(a[n], b[n]) for n in a)
        t = torch.tensor([[got[3][k], ref[3][k]] for k in sorted(ref[3])], dtype=torch.float64)
        torch.distributed.all_reduce(t)  # a loss metric is this rank's share of the mini-batch's loss
        w["losses"] = max(abs(a - b) / max(abs(b), 1e-12) for a, b in t.tolist())
        worst[name] = w
        assert max(w.values()) <= TOL, f"{strategy} {name}: worst relative differences {w}"
        if sp == 1:  # the forward and the loss see the same parameters and rows: bit for bit
            assert all(w[k] == 0 for k in (*ref[0], "losses")), f"{strategy} {name}: {w}"
    if rank == 0:
        print(f"HSDP WORST {strategy}", {n: {k: f"{v:.1e}" for k, v in w.items()} for n, w in worst.items()})


# ---- checkpoints ---------------------------------------------------------------------------------------------
def _engine(strategy: str, fsdp_size: int):
    from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig, OptimConfig
    from rlx.engine.actor import ActorEngine

    actor_cfg = ActorConfig(strategy=strategy, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2,
                            optim=OptimConfig(lr=1e-2, lr_warmup_steps=3))
    model_cfg = ModelConfig(path="builtin://tiny-qwen2", enable_gradient_checkpointing=False, use_remove_padding=False)
    return ActorEngine(role="actor", model_cfg=model_cfg, actor_cfg=actor_cfg, fsdp_cfg=FSDPConfig(fsdp_size=fsdp_size),
                       strategy=strategy, device=torch.device("cpu"), world_size=WORLD, rollout_n=2,
                       temperature=1.0, total_steps=10)


def _checkpoint(rank, strategy, root):
    from rlx import checkpoint as ckpt
    from unit.test_checkpoint import _full_params, _train_step

    a = _engine(strategy, 2)
    _train_step(a, 1, rank)
    path = os.path.join(root, "actor")
    ckpt.save_engine(a, path)
    full1 = _full_params(a)
    lp2, m2 = _train_step(a, 2, rank)
    params2 = _full_params(a)

    b = _engine(strategy, 2)  # resumes under hybrid sharding and repeats step 2 exactly
    ckpt.load_engine(b, path)
    lp2b, m2b = _train_step(b, 2, rank)
    assert torch.equal(lp2, lp2b)
    assert m2["actor/pg_loss"] == m2b["actor/pg_loss"] and m2["actor/grad_norm"] == m2b["actor/grad_norm"]
    params2b = _full_params(b)  # once: each call all-gathers every parameter (was once per key: most of the
    # test's collectives, where a gloo heap corruption was seen under load)
    assert all(torch.equal(v, params2b[k]) for k, v in params2.items())
    assert any(not torch.equal(v, full1[k]) for k, v in params2.items()), "step 2 changed nothing"

    c = _engine(strategy, -1)  # the same checkpoint in a fully sharded engine: the same weights
    ckpt.load_engine(c, path)
    got = _full_params(c)
    assert got.keys() == full1.keys() and all(torch.equal(v, got[k]) for k, v in full1.items())


def _materialise():
    from rlx.models import resolve_model_path

    resolve_model_path("builtin://tiny-qwen2")  # once, before the ranks race for it


# ---- validation ----------------------------------------------------------------------------------------------
def test_fsdp_size_must_divide_the_world():
    from conftest import load_config

    base = ["trainer.n_gpus_per_node=4", "trainer.device=cpu", "algorithm.adv_estimator=gae",
            "critic.ppo_micro_batch_size_per_gpu=2"]
    with pytest.raises(ValueError) as e:
        load_config(base + ["actor_rollout_ref.actor.fsdp_config.fsdp_size=3", "critic.model.fsdp_config.fsdp_size=0"])
    msg = str(e.value)
    assert "actor_rollout_ref.actor.fsdp_config.fsdp_size=3 must divide the world size 4" in msg, msg
    assert "critic.model.fsdp_config.fsdp_size=0 must divide" in msg, msg
    # verl's meaning: -1, a divisor, or a size of at least the world (a script written for more GPUs)
    for n in (-1, 1, 2, 4, 8, 32):
        cfg = load_config(base + [f"actor_rollout_ref.actor.fsdp_config.fsdp_size={n}"])
        assert cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size == n


def _refuses(rank, strategy, root):
    from rlx.engine.fsdp import shard_mesh

    assert shard_mesh(-1, torch.device("cpu")) is None and shard_mesh(2, torch.device("cpu")) is None
    with pytest.raises(ValueError, match=r"critic.model.fsdp_config.fsdp_size=0 must divide the world size 2"):
        shard_mesh(0, torch.device("cpu"), "critic.model.fsdp_config.fsdp_size")
    assert shard_mesh(1, torch.device("cpu")).shape == (2, 1)
