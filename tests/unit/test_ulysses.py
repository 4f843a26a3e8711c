"""Ulysses sequence parallelism at the engine level (real FSDP1/FSDP2 over gloo; fp32; the builtin tiny Qwen2:
4 attention heads, 2 KV heads).

The same global batch runs at SP=1 (every rank its own rows) and at SP=sp (the ranks of a group share rows, each
holds 1/sp of the packed row): log-probs, entropy, values, the loss and every parameter gradient agree within
1e-5 relative, for the actor and the critic, plain and with offload + checkpointing + tiled MLP or tiled decoder
layers + fused head, and dynamic batch size; at sp=4 the 2 KV heads are repeated. The batch's packed sequences
have unequal lengths, one of them shorter than sp tokens. Also: per-rank saved activations at SP=2 are about half of SP=1's.
"""
from __future__ import annotations

import pytest
import torch

from ranks import end_rank
from conftest import free_port as _free_port
from unit.test_batch_shaping import _capture_grads, _cfg, lengths_batch

TOL = 1e-5
WORST: dict = {}  # case -> worst relative difference seen (printed for the closing note)

# 8 rows; row 1 is 2 + 1 = 3 tokens (shorter than sp=4), the others of unequal lengths
BATCH = dict(prompt_lens=[6, 2, 4, 3, 5, 6, 2, 4], resp_lens=[9, 1, 7, 3, 8, 5, 9, 2])

COMMON = ["actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
          "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.use_kl_loss=True",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3", "critic.ppo_mini_batch_size=4",
          "critic.ppo_micro_batch_size_per_gpu=3"]
LONG = ["actor_rollout_ref.model.enable_activation_offload=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.tile_mlp_tokens=8", "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.model.fused_kernel_options.chunk_size=5"]
LAYER = [o.replace("tile_mlp_tokens", "tile_layer_tokens") for o in LONG]  # tiled decoder layers instead
LORA = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.model.target_modules=all-linear"]  # the actor's only: the critic trains in full
DYN = ["actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20",
       "critic.use_dynamic_bsz=True", "critic.ppo_max_token_len_per_gpu=20", "critic.forward_max_token_len_per_gpu=20"]


def _engines(strategy, over, sp, world, device):
    from rlx.engine.actor import ActorEngine
    from rlx.engine.critic import CriticEngine

    cfg = _cfg(strategy, COMMON + list(over) + [f"trainer.n_gpus_per_node={world}",
                                                f"critic.ulysses_sequence_parallel_size={sp}"])
    arr = cfg.actor_rollout_ref
    torch.manual_seed(0)
    actor = ActorEngine(role="actor", model_cfg=arr.model, actor_cfg=arr.actor, fsdp_cfg=arr.actor.fsdp_config,
                        strategy=strategy, device=device, world_size=world, rollout_n=2,
                        temperature=0.7, sp_size=sp)
    critic_over = [o.replace("actor_rollout_ref.model.", "critic.model.") for o in COMMON + list(over)
                   if "fused" not in o and o not in LORA]
    cfg = _cfg(strategy, critic_over + [f"trainer.n_gpus_per_node={world}",
                                        f"critic.ulysses_sequence_parallel_size={sp}"])
    torch.manual_seed(0)
    critic = CriticEngine(critic_cfg=cfg.critic, device=device, world_size=world)
    return actor, critic


def _run(strategy, over, sp, world, batch, dyn_forward, device=torch.device("cpu")):
    """Outputs and gradients of one SP setting: this rank's rows are its data-parallel group's share."""
    rank = torch.distributed.get_rank()
    dp_rank, dp = rank // sp, world // sp
    rows = batch.chunk(dp)[dp_rank]
    actor, critic = _engines(strategy, over, sp, world, device)
    out = dict(actor.compute_log_prob(rows, 3, with_entropy=True, max_token_len=dyn_forward).tensors)
    out["values"] = critic.compute_values(rows)["values"]  # (both on the CPU: the engines' outputs)
    g_actor = _capture_grads(actor)
    m_actor = actor.update_policy(rows)
    g_critic = _capture_grads(critic)
    m_critic = critic.update_critic(rows)
    losses = {k: m_actor[k] for k in ("actor/pg_loss", "actor/entropy", "actor/kl_loss")}
    losses["critic/vf_loss"] = m_critic["critic/vf_loss"]
    return out, dp_rank, dp, g_actor, g_critic, losses


def _worst(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()


def _compare(case, got, ref, losses_got, losses_ref, per_rank_ref):
    out_sp, dp_rank_sp, dp_sp = got[0], got[1], got[2]
    world = torch.distributed.get_world_size()
    # the reference's outputs from every rank, in row order, then this SP group's rows
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, per_rank_ref)
    full = {k: torch.cat([g[k].cpu() for g in gathered]) for k in per_rank_ref}
    mine = {k: v.chunk(dp_sp)[dp_rank_sp] for k, v in full.items()}
    worst = {k: _worst(out_sp[k], mine[k]) for k in mine}  # log_probs, entropys, values
    for what, a, b in (("actor grads", got[3], ref[3]), ("critic grads", got[4], ref[4])):
        assert a.keys() == b.keys() and a, what
        worst[what] = max(_worst(a[n].cpu(), b[n].cpu()) for n in a)
    # a loss metric is this rank's share of the mini-batch's loss; summed over ranks, the same at any sp
    worst["losses"] = max(abs(losses_got[k] - losses_ref[k]) / max(abs(losses_ref[k]), 1e-12) for k in losses_ref)
    WORST[case] = {k: f"{v:.1e}" for k, v in worst.items()}
    assert max(worst.values()) <= TOL, f"{case}: worst relative differences {WORST[case]}"


def _summed_losses(losses):
    dev = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    t = torch.tensor([losses[k] for k in sorted(losses)], dtype=torch.float64, device=dev)
    torch.distributed.all_reduce(t)
    return {k: float(v) for k, v in zip(sorted(losses), t)}


def _init_rank(rank, world, port, device_type):
    """This rank's device and process group: on CUDA one GPU per rank over NCCL, in fp32 without TF32 (so the
    tolerances are the CPU ones); else gloo on the CPU."""
    device = torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        device = torch.device("cuda", rank)
    torch.distributed.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                         init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    return device


def _exactness_worker(rank, world, port, strategy, sps, cases, device_type="cpu"):
    device = _init_rank(rank, world, port, device_type)
    import rlx.ops.tiled_layer as tl
    tiled_backwards, orig = [0], tl._TiledLayer.backward

    def counted(ctx, grad_out):
        tiled_backwards[0] += 1
        return orig(ctx, grad_out)

    tl._TiledLayer.backward = staticmethod(counted)  # this spawned process only
    try:
        batch = lengths_batch(**BATCH)
        for name, over, dyn_forward in cases:
            ref = _run(strategy, over, 1, world, batch, dyn_forward, device)
            ref_losses = _summed_losses(ref[5])
            for sp in sps:
                tiled_backwards[0] = 0
                got = _run(strategy, over, sp, world, batch, dyn_forward, device)
                # the tiled layers ran their own backward at sp > 1 (actor and critic: 2 layers each at least)
                assert ("layer" not in name) == (tiled_backwards[0] == 0), (name, sp, tiled_backwards[0])
                if "lora" in name:  # the actor trains its adapters only
                    assert got[3] and all("lora_" in n for n in got[3]), sorted(got[3])
                _compare(f"{strategy} sp={sp} {name}", got, ref, _summed_losses(got[5]), ref_losses, ref[0])
        if rank == 0:
            print("ULYSSES WORST", WORST)
    finally:
        end_rank()


def _spawn(fn, world, *args):
    from rlx.models import resolve_model_path

    resolve_model_path("builtin://tiny-qwen2")  # materialise once, before the ranks race for it
    torch.multiprocessing.spawn(fn, args=(world, _free_port(), *args), nprocs=world, join=True)


def _memory_worker(rank, world, port, out_file):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        from rlx.engine.actor import ActorEngine

        rows = lengths_batch([6] * 4, [120, 100, 110, 90], resp=120)  # 466 tokens, one micro-batch
        got = {}
        for sp in (1, 2):
            cfg = _cfg("fsdp2", COMMON + ["actor_rollout_ref.model.enable_activation_offload=True",
                                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                                          "actor_rollout_ref.actor.ppo_mini_batch_size=2"])
            arr = cfg.actor_rollout_ref
            torch.manual_seed(0)
            # at sp=1 every rank runs all 4 rows (world_size=1 data parallel group's share), at sp=2 a half each
            e = ActorEngine(role="actor", model_cfg=arr.model, actor_cfg=arr.actor, fsdp_cfg=arr.actor.fsdp_config,
                            strategy="fsdp2", device=torch.device("cpu"), world_size=sp, rollout_n=2,
                            temperature=1.0, sp_size=sp)
            e.update_policy(rows)
            got[sp] = e.offloader.stats()["offloaded_bytes_last_step"]
        if rank == 0:
            torch.save(got, out_file)
    finally:
        end_rank()


# ---- validation (before Ray starts) ----------------------------------------------------------------------------
A, R, C = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",
           "actor_rollout_ref.ref.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size")
SP_OK = ["trainer.device=cpu", "trainer.n_gpus_per_node=4", "data.train_batch_size=8",
         "actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=True",
         "actor_rollout_ref.actor.use_kl_loss=True", "algorithm.adv_estimator=gae"]


def _errors(over) -> str:
    from conftest import refusal  # the quickstart config: validation and the preflight's model probes (heads)

    return refusal(SP_OK + list(over))


def test_sp_config_accepted():
    from conftest import load_config  # the quickstart config

    cfg = load_config(SP_OK + [f"{A}=2", f"{R}=4", f"{C}=2"])
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    assert cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 4
    # the ref follows the actor unless set (verl's default)
    assert load_config(SP_OK + [f"{A}=2"]).actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2
    # tiled decoder layers compose with sequence parallelism (actor and critic)
    tiled = [f"{m}.{k}" for m in ("actor_rollout_ref.model", "critic.model")
             for k in ("tile_layer_tokens=8192", "enable_gradient_checkpointing=True")]
    assert load_config(SP_OK + [f"{A}=2", f"{C}=2"] + tiled).critic.model.tile_layer_tokens == 8192


@pytest.mark.parametrize("key", [A, R, C])
def test_sp_must_divide_world_size(key):
    msg = _errors([f"{key}=3", "actor_rollout_ref.model.override_config.num_attention_heads=6",
                   "critic.model.override_config.num_attention_heads=6"])
    assert f"{key}=3 must divide the world size 4" in msg and "trainer.n_gpus_per_node" in msg, msg


@pytest.mark.parametrize("key,model", [(A, "actor_rollout_ref.model"), (R, "actor_rollout_ref.model"),
                                       (C, "critic.model")])
def test_sp_needs_remove_padding(key, model):
    msg = _errors([f"{key}=2", f"{model}.use_remove_padding=False"])
    assert f"{key}=2 shards the packed" in msg and f"Fix: {model}.use_remove_padding=True" in msg, msg


def test_sp_must_divide_attention_heads_and_fit_kv_heads():
    msg = _errors([f"{C}=4", "critic.model.override_config.num_attention_heads=6"])
    assert f"{C}=4 must divide the model's num_attention_heads=6" in msg, msg
    msg = _errors([f"{A}=4", "trainer.n_gpus_per_node=8",
                   "actor_rollout_ref.model.override_config.num_attention_heads=8",
                   "actor_rollout_ref.model.override_config.num_key_value_heads=6"])
    assert f"{A}=4 and the model's num_key_value_heads=6" in msg, msg


def test_sp_mini_batch_splits_over_data_parallel_groups():
    from conftest import load_config  # the quickstart config

    # 4 ranks, sp=2: 2 groups; 3 prompts x n=2 = 6 sequences split over 2 groups, not over 4 ranks
    ok = ["data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=3", "critic.ppo_mini_batch_size=3",
          "actor_rollout_ref.rollout.n=2"]
    load_config(SP_OK + ok + [f"{A}=2", f"{C}=2"])
    msg = _errors(ok + [f"{A}=1", f"{C}=2"])
    assert "actor_rollout_ref.actor.ppo_mini_batch_size * rollout.n = 3*2 = 6 sequences must divide across world" \
        in msg and "critic.ppo_mini_batch_size" not in msg, msg


def _bf16_logprob_worker(rank, world, port, device_type, out_file):
    """The actor's log-probs of one batch at fp32 SP=1 (the reference), bf16 SP=1 and bf16 SP=2 (FSDP2, bf16 mixed
    precision as a GPU job runs it; offload + checkpointing + tiled decoder layers + fused head; sequences of a
    few hundred tokens); rank 0 saves them in row order."""
    device = _init_rank(rank, world, port, device_type)
    try:
        from rlx.engine.actor import ActorEngine

        g = torch.Generator().manual_seed(0)
        resp = torch.randint(64, 400, (8,), generator=g).tolist()
        batch = lengths_batch(torch.randint(8, 64, (8,), generator=g).tolist(), resp, prompt=64, resp=400, g=g)
        out = {}
        for name, sp, dtype in (("fp32 sp1", 1, "fp32"), ("bf16 sp1", 1, "bf16"), ("bf16 sp2", 2, "bf16")):
            cfg = _cfg("fsdp2", COMMON + LAYER + [
                f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={dtype}",
                "actor_rollout_ref.model.fused_kernel_options.chunk_size=256",
                "actor_rollout_ref.model.tile_layer_tokens=256"])
            arr = cfg.actor_rollout_ref
            torch.manual_seed(0)
            actor = ActorEngine(role="actor", model_cfg=arr.model, actor_cfg=arr.actor, fsdp_cfg=arr.actor.fsdp_config,
                                strategy="fsdp2", device=device, world_size=world, rollout_n=2, temperature=0.7,
                                sp_size=sp)
            dp_rank, dp = rank // sp, world // sp
            lp = actor.compute_log_prob(batch.chunk(dp)[dp_rank], 4)["log_probs"].float().cpu()
            parts = [None] * world
            torch.distributed.all_gather_object(parts, (dp_rank, lp))
            out[name] = torch.cat([p for _, p in sorted({d: p for d, p in parts}.items())])
            del actor
        if rank == 0:
            torch.save(dict(out, mask=batch["response_mask"].bool()), out_file)
    finally:
        end_rank()


def bf16_noise_check(got: dict) -> str:
    """SP=2 in bf16 is no further from the fp32 log-probs than SP=1 in bf16 (what bf16 itself costs): mean absolute
    difference within 1.5x, the largest within 3x (an SP bug, such as misplaced positions or heads, is off by
    O(1)). Returns the line to print; raises AssertionError otherwise."""
    mask = got["mask"]
    ref = got["fp32 sp1"][mask]
    d1, d2 = (got["bf16 sp1"][mask] - ref).abs(), (got["bf16 sp2"][mask] - ref).abs()
    sp_vs_sp = (got["bf16 sp2"][mask] - got["bf16 sp1"][mask]).abs()
    line = (f"log-probs vs fp32 SP=1 over {int(mask.sum())} tokens: bf16 SP=1 mean {d1.mean():.2e} max {d1.max():.2e}; "
            f"bf16 SP=2 mean {d2.mean():.2e} max {d2.max():.2e}; bf16 SP=2 vs SP=1 max {sp_vs_sp.max():.2e}")
    assert d2.mean() <= 1.5 * d1.mean() + 1e-6 and d2.max() <= 3 * d1.max() + 1e-5, line
    return line

