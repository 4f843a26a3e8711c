"""Rollout on its own pool, overlapped with training (actor_rollout_ref.hybrid_engine=False; rlx.trainer.async_trainer):
the config's rules, the plan's pools, the staleness bound, partial rollout's version tags, and on real Ray workers
(2 CPU processes in 2 pools, the HF engine) the on-policy run equal to the colocated run, loss for loss."""
from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest
import torch

from conftest import load_config
from rlx.plan import ROLLOUT_GROUP, ROLLOUT_POOL, TRAINER_POOL, make_plan
from rlx.protocol import Batch
from rlx.trainer.async_trainer import AsyncPPOTrainer, Gate, Rollouter, lag, stale_rows, staleness_metrics

DISAGG = ["actor_rollout_ref.hybrid_engine=False", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
          "actor_rollout_ref.rollout.name=hf", "trainer.device=cpu"]


# ---- config and plan ---------------------------------------------------------------------------------------------
def test_hybrid_engine_false_needs_rollout_gpus():
    with pytest.raises(ValueError, match=r"hybrid_engine=False needs the rollout's own GPUs.*Fix: set "
                                         r"rollout.n_gpus_per_node"):
        load_config(["actor_rollout_ref.hybrid_engine=False", "trainer.device=cpu"])


def test_rollout_gpus_without_disaggregation_is_refused():
    with pytest.raises(ValueError, match=r"rollout.n_gpus_per_node=1 .*Fix: set actor_rollout_ref.hybrid_engine=False"):
        load_config(["rollout.n_gpus_per_node=1", "trainer.device=cpu"])


@pytest.mark.parametrize("key", ["async_training.require_batches=2", "rollout.total_rollout_steps=100", "rollout.test_freq=5",
                                 "async_training.trigger_parameter_sync_step=0",
                                 "async_training.staleness_threshold=-1"])
def test_async_keys_rlx_does_not_take_are_refused(key):
    with pytest.raises(ValueError, match=key.split("=")[0].replace(".", r"\.")):
        load_config(DISAGG + [key])


def test_partial_rollout_with_the_agent_loop_is_refused():
    with pytest.raises(ValueError, match="partial_rollout=True pauses single-turn"):
        load_config(DISAGG + ["actor_rollout_ref.rollout.mode=async", "async_training.partial_rollout=True"])


@pytest.mark.parametrize("extra,held", [([], None), (["async_training.partial_rollout=True"], 1536),
                                        (["async_training.partial_rollout=True",
                                          "actor_rollout_ref.rollout.max_num_seqs=1536"], None)])
def test_a_rollout_engine_handed_more_requests_than_max_num_seqs_is_named(extra, held):
    from rlx.trainer.cli import rollout_queue_notes

    argv = [k for k in DISAGG if "rollout.name" not in k] + [
        "actor_rollout_ref.rollout.name=vllm", "data.train_batch_size=64", "actor_rollout_ref.rollout.n=8",
        "async_training.staleness_threshold=2"] + extra
    cfg = load_config(argv)
    notes = rollout_queue_notes(cfg, make_plan(cfg, vllm_installed=lambda: True))
    if held is None:  # one batch of 512, or max_num_seqs raised to hold three
        assert notes == []
    else:  # staleness 2 with partial rollout: 3 batches of 64 x 8 on one engine
        limit = cfg.actor_rollout_ref.rollout.max_num_seqs
        assert limit < held
        assert notes == [f"rlx: note: each rollout engine holds up to {held} requests at once (3 batch(es) of "
                         "data.train_batch_size=64 x rollout.n=8 over 1 engine(s)), more than "
                         f"actor_rollout_ref.rollout.max_num_seqs={limit}: the rest "
                         "wait for a free slot, the oldest batch's first. To run them all at once: "
                         f"actor_rollout_ref.rollout.max_num_seqs={held}, if its KV cache holds them"]
    hf = load_config(DISAGG + extra + ["async_training.staleness_threshold=2"])
    assert rollout_queue_notes(hf, make_plan(hf, vllm_installed=lambda: False)) == []  # HF batches per call


@pytest.mark.parametrize("threshold,bound", [(0, 0), (0.5, 1), (1, 1), (1.2, 2), (3, 3)])
def test_plan_pools_and_staleness_bound(threshold, bound):
    cfg = load_config(DISAGG + [f"async_training.staleness_threshold={threshold}",
                                "async_training.trigger_parameter_sync_step=2"])
    plan = make_plan(cfg, vllm_installed=lambda: False)
    assert plan.rollout.disaggregated and plan.async_.staleness == bound and plan.async_.sync_every == 2
    assert plan.placement.groups[ROLLOUT_GROUP] == ROLLOUT_POOL
    assert {n: p.world_size for n, p in plan.placement.pools.items()} == {TRAINER_POOL: 1, ROLLOUT_POOL: 1}
    assert plan.placement.bundles == 2
    # the lag is corrected by default only when there is one, and only when the user chose no correction
    assert plan.async_.default_is_correction == (bound > 0)


@pytest.mark.parametrize("extra,match", [
    (["rollout.engines_per_gpu=0"], r"rollout.engines_per_gpu=0 must be >= 1"),
    (["rollout.engines_per_gpu=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     r"tensor_model_parallel_size=2 spreads one engine.*Fix: rollout.engines_per_gpu=1"),
    (["rollout.engines_per_gpu=3", "actor_rollout_ref.rollout.name=vllm",
      "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"],
     r"3 engines of actor_rollout_ref.rollout.gpu_memory_utilization=0.5 each ask for 1.50 of a GPU \(at most 0.95 "
     r"starts\). Fix: actor_rollout_ref.rollout.gpu_memory_utilization=0.3 "),
    (["rollout.engines_per_gpu=2", "actor_rollout_ref.rollout.name=vllm",
      "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"],
     r"Fix: actor_rollout_ref.rollout.gpu_memory_utilization=0.45 "),
])
def test_engines_per_gpu_rules(extra, match):
    with pytest.raises(ValueError, match=match):
        load_config(DISAGG + extra)


def test_engines_per_gpu_is_refused_colocated():
    with pytest.raises(ValueError, match=r"rollout.engines_per_gpu=2 places rollout ranks.*Fix: "
                                         r"rollout.engines_per_gpu=1, or actor_rollout_ref.hybrid_engine=False"):
        load_config(["rollout.engines_per_gpu=2", "trainer.device=cpu"])


def test_engines_per_gpu_places_several_ranks_per_bundle():
    """Two engines on each of 2 rollout GPUs: 4 rollout ranks on 2 bundles; the job counts 3 GPUs; the transfer
    groups (one per engine slot) each hold one rank per GPU."""
    from rlx.workers.weight_transfer import transfer_slots

    cfg = load_config(DISAGG + ["rollout.n_gpus_per_node=2", "rollout.engines_per_gpu=2"])
    pool = make_plan(cfg, vllm_installed=lambda: False).placement
    assert (pool.pools[ROLLOUT_POOL].world_size, pool.pools[ROLLOUT_POOL].bundles) == (4, 2)
    assert pool.bundles == 3
    assert transfer_slots(4, 2) == [[0, 2], [1, 3]]  # ranks 0, 1 share GPU 0 and ranks 2, 3 GPU 1
    assert transfer_slots(3, 1) == [[0, 1, 2]]
    hf_two = load_config(DISAGG + ["rollout.engines_per_gpu=2", "actor_rollout_ref.rollout.gpu_memory_utilization=0.9"])
    assert hf_two.rollout.engines_per_gpu == 2  # hf takes no share of the GPU's memory up front


def test_colocated_plan_has_no_async_part():
    plan = make_plan(load_config(["trainer.device=cpu"]), vllm_installed=lambda: False)
    assert plan.async_ is None and not plan.rollout.disaggregated and ROLLOUT_POOL not in plan.placement.pools


def test_user_correction_and_bypass_are_kept():
    cfg = load_config(DISAGG + ["algorithm.rollout_correction.rollout_is=sequence",
                                "actor_rollout_ref.rollout.calculate_log_probs=True"])
    assert not make_plan(cfg, vllm_installed=lambda: False).async_.default_is_correction
    cfg = load_config(DISAGG + ["async_training.use_rollout_log_probs=True"])
    a = make_plan(cfg, vllm_installed=lambda: False).async_
    assert a.rollout_log_probs_as_old and not a.default_is_correction


# ---- the staleness bound -----------------------------------------------------------------------------------------
def test_lag_counts_syncs_between_the_generating_and_the_training_weights():
    assert lag(1, 0, 1) == 0  # batch 1, generated by the initial weights, trained from them
    assert lag(2, 0, 1) == 1  # one-step-off: batch 2 generated while batch 1 trained
    assert lag(5, 3, 1) == 1 and lag(5, 2, 1) == 2
    assert lag(4, 2, 2) == 0 and lag(5, 2, 2) == 1  # a version spans 2 steps with trigger_parameter_sync_step=2


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_rollouter_admits_a_batch_only_within_the_bound(bound):
    r = Rollouter.__new__(Rollouter)
    r.trainer = types.SimpleNamespace(plan=types.SimpleNamespace(async_=types.SimpleNamespace(
        staleness=bound, sync_every=1)))
    for step in range(1, 8):
        for version in range(0, step):
            assert r.admits(step, version) == (step - 1 - version <= bound)


def _batch(versions: list[list[int]], uids: list[str], mask=None) -> Batch:
    v = torch.tensor(versions)
    mask = torch.ones_like(v) if mask is None else torch.tensor(mask)
    return Batch({"rollout_token_versions": v, "response_mask": mask},
                 non_tensors={"uid": np.array(uids, dtype=object)})


def test_a_sample_older_than_the_bound_is_never_trained_on():
    """Trained at step 5 with bound 1: versions 4 and 3 lag 0 and 1 (kept); a sample whose oldest token is from
    version 2 lags 2 and is dropped with its whole group (its GRPO baseline would be skewed without it)."""
    batch = _batch([[4, 4], [3, 4], [2, 4], [3, 3]], ["a", "a", "b", "b"])
    fake = types.SimpleNamespace(plan=types.SimpleNamespace(async_=types.SimpleNamespace(staleness=1, sync_every=1)),
                                 global_step=5)
    metrics: dict = {}
    kept = AsyncPPOTrainer.drop_stale(fake, batch, metrics)
    assert list(kept["uid"]) == ["a", "a"]
    assert metrics["async/dropped_stale_samples"] == 1.0 and metrics["async/staleness_max"] == 2.0
    assert stale_rows(batch["rollout_token_versions"], batch["response_mask"], 5, 1, 1).tolist() == \
        [False, False, True, False]


def test_staleness_metrics_ignore_padding_and_count_partial_samples():
    # row 0: tokens of versions 1 then 2 (a partial rollout across a sync); row 1: one version; padding tagged 0
    m = staleness_metrics(torch.tensor([[1, 2, 0], [2, 2, 0]]), torch.tensor([[1, 1, 0], [1, 1, 0]]), 3, 1)
    assert m["async/staleness_max"] == 1.0 and m["async/staleness_mean"] == 0.5
    assert m["async/partial_samples"] == 1.0
    assert m["async/version_lag/0"] == 0.5 and m["async/version_lag/1"] == 0.5


def test_gate_pause_waits_for_the_rollout_call_in_flight_and_holds_the_next():
    gate, order = Gate(version=0), []
    inside = threading.Event()

    def rollouter():
        with gate.rollout_call():
            inside.set()
            time.sleep(0.2)
            order.append("call 1 ends")
        time.sleep(0.05)  # the sync asked meanwhile: the next call waits for it
        with gate.rollout_call():
            order.append("call 2")

    t = threading.Thread(target=rollouter)
    t.start()
    inside.wait()
    with gate.paused():
        order.append("sync")
        time.sleep(0.1)
        gate.set_version(1)
    t.join()
    assert order == ["call 1 ends", "sync", "call 2"]


# ---- partial rollout: tokens tagged with the version that produced them ------------------------------------------
def test_partial_rollout_tags_each_token_with_its_version(tiny_model_path):
    """A rank's share generated in segments of 3 tokens; between segments the weights change (as a sync does): the
    tokens before carry version 0, those after version 1, and the later tokens come from the new weights. A second
    batch opened after the change advances in the same calls (the engine takes both), all at version 1."""
    from rlx.workers.rollout.hf_rollout import HFRollout
    from rlx.workers.rollout_worker import VERSIONS, RolloutWorker

    cfg = load_config(DISAGG + ["actor_rollout_ref.model.path=" + tiny_model_path, "data.max_response_length=8"])
    w = RolloutWorker.__new__(RolloutWorker)
    w.cfg, w.rank, w.partials = cfg, 0, {}
    w.plan = make_plan(cfg, vllm_installed=lambda: False)
    from transformers import AutoTokenizer

    w.tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    eos = w.tokenizer.eos_token_id
    w.rollout = HFRollout(tiny_model_path, max_response_length=8, pad_token_id=w.tokenizer.pad_token_id,
                          eos_token_id=[-1], device=torch.device("cpu"), calculate_log_probs=True)
    w.version = 0
    sampling = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1)
    prompts = Batch({"input_ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
                     "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}, meta=dict(n=2, seed=3, **sampling))
    w.begin(prompts, key=0)
    assert w.advance(3) == {0: 4}  # no EOS possible (eos -1): every response goes on
    with torch.no_grad():  # "sync": new weights
        for p in w.rollout.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    w.version = 1
    w.begin(Batch({"input_ids": torch.tensor([[4, 5, 6]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)},
                  meta=dict(n=2, seed=4, **sampling)), key=1)
    assert w.advance(3) == {0: 4, 1: 2}  # both batches moved by one segment
    while any(w.advance(3).values()):
        pass
    out, second = w.collect(0), w.collect(1)
    assert not w.partials
    assert out["responses"].shape == (4, 8) and bool(out["response_mask"].all())
    assert out[VERSIONS].tolist() == [[0, 0, 0, 1, 1, 1, 1, 1]] * 4
    assert second[VERSIONS].tolist() == [[1] * 8] * 2
    # the tokens after the sync are those the new weights give (re-scored: the log-probs match)
    full = out["input_ids"]
    logits = w.rollout.model(input_ids=full, attention_mask=out["attention_mask"],
                             position_ids=out["position_ids"]).logits.float()
    lp = torch.log_softmax(logits[:, 2:-1], -1).gather(-1, full[:, 3:, None]).squeeze(-1)
    assert torch.allclose(lp[:, 3:], out["rollout_log_probs"][:, 3:], atol=1e-4)
    assert not torch.allclose(lp[:, :3], out["rollout_log_probs"][:, :3], atol=1e-3)
    del eos


# ---- on real Ray workers -----------------------------------------------------------------------------------------
def _fit(overrides, tmp_path, async_: bool):
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    cfg = load_config(list(overrides) + [f"trainer.default_local_dir={tmp_path}"])
    plan = make_plan(cfg)
    trainer = (AsyncPPOTrainer if async_ else RayPPOTrainer)(cfg, plan)
    try:
        trainer.init_workers()
        return trainer.fit()
    finally:
        trainer.shutdown()


COMMON = ["trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.save_freq=-1", "trainer.device=cpu",
          "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.name=hf",
          "actor_rollout_ref.rollout.calculate_log_probs=True", "trainer.val_before_train=False"]
COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl", "critic/score/mean",
            "response_length/mean", "training/rollout_probs_diff_mean")

# ---- the benchmark's long-tailed model -------------------------------------------------------------------------
def test_set_stop_rate_spreads_response_lengths():
    """rlx.models.random_weights.set_stop_rate on a small random model: about the asked share of responses runs to
    the cap, the others stop at lengths spread over the whole range (the long tail bench_async measures)."""
    import transformers

    from rlx.models.random_weights import random_model, set_stop_rate
    from rlx.workers.rollout.hf_rollout import HFRollout

    cfg = transformers.AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                            tie_word_embeddings=False, eos_token_id=2, pad_token_id=0)
    model = random_model(cfg)
    beta = set_stop_rate(model, eos_id=2, length=32, reach=0.5, sequences=32, tokens=64)
    assert beta > 0
    rollout = HFRollout.__new__(HFRollout)
    rollout.model, rollout.device, rollout.max_response_length = model.float().eval(), torch.device("cpu"), 32
    rollout.pad_token_id, rollout.eos_token_id, rollout.ignore_eos = 0, 2, False
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 512, (64, 4), generator=g)
    with torch.no_grad():
        out, _ = rollout._generate(ids, torch.ones_like(ids), True, 1.0, -1, 1.0, g)
    lengths = [(row.tolist().index(2) + 1) if 2 in row.tolist() else 32 for row in out]
    capped = sum(n == 32 for n in lengths) / len(lengths)
    assert 0.2 <= capped <= 0.8, (capped, sorted(lengths))
    assert min(lengths) < 8 and len(set(lengths)) > 8, sorted(lengths)  # spread, not one length


def test_random_model_computes_the_buffers_to_empty_leaves_uninitialised():
    """random_model builds on the meta device; `to_empty` gives the buffers uninitialised memory. The rotary
    embedding's inverse frequencies (never saved: vLLM and the trainer compute their own) are what set_stop_rate's
    forward uses, so garbage there gave machine-dependent stop rates (a NaN made beta 0: no response ever ended).
    They are computed as a CPU-built module computes them, and the stop rate is the same in every build."""
    import transformers

    from rlx.models.random_weights import random_model, set_stop_rate

    cfg = transformers.AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                            tie_word_embeddings=False, eos_token_id=2, pad_token_id=0)
    fresh = transformers.AutoModelForCausalLM.from_config(cfg)
    want = dict(fresh.named_buffers())
    assert want, "the model has buffers to check"
    betas = []
    for _ in range(2):
        torch.empty(1 << 20).fill_(float("nan"))  # freed memory that an uninitialised buffer could reuse
        model = random_model(cfg)
        for name, buf in model.named_buffers():
            assert torch.equal(buf, want[name]), name
        betas.append(set_stop_rate(model, eos_id=2, length=32, reach=0.5, sequences=8, tokens=32))
    assert betas[0] == betas[1] > 0


def test_bench_async_table_from_histories(monkeypatch):
    """benchmarks/bench_async.py's summary of each mode's per-step metrics (means over the steps after the first) and
    its table, from histories alone: the speed-up is sync's seconds per step over the mode's."""
    import importlib.util

    from conftest import REPO

    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_FLASHINFER_SAMPLER", "RAY_LOG_TO_DRIVER"):
        monkeypatch.setenv(key, "0")  # what the script sets for its jobs, put back after the test
    spec = importlib.util.spec_from_file_location("bench_async", f"{REPO}/benchmarks/bench_async.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def history(step_s: float, async_: bool) -> list[dict]:
        m = {"timing_s/step": step_s, "perf/total_num_tokens": 1000.0, "timing_s/gen": 1.0,
             "timing_s/old_log_prob": 0.5, "timing_s/update_actor": 2.0, "timing_s/worker/old_log_prob": 0.4,
             "timing_s/worker/update_actor": 1.9, "response_length/mean": 10.0, "response_length/max": 20.0,
             "critic/score/mean": 0.5}
        if async_:
            m.update({"async/trainer_idle_ratio": 0.1, "async/rollout_idle_ratio": 0.2,
                      "timing_s/sync_weights": 0.05, "async/staleness_mean": 1.0})
        return [dict(m, **{"timing_s/step": 99.0}), m, m]  # the first step (warm-up) is left out of the means

    sync = bench.row("sync", history(4.0, False), None)
    off1 = bench.row("off1", history(2.0, True), sync)
    assert sync["s/step"] == 4.0 and off1["tokens/s"] == 500.0 and off1["speed-up"] == 2.0
    assert off1["train s"] == 2.5 and off1["worker lp+upd s"] == pytest.approx(2.3)
    assert off1["staleness"] == 1.0 and sync["trainer idle"] is None
    text = bench.table([sync, off1])
    header, _, *rows = text.splitlines()
    assert header.startswith("| mode ") and [r.split("|")[1].strip() for r in rows] == ["sync", "off1"]


def test_pipeline_model_follows_the_staleness_bound():
    """benchmarks/model_async.py on a case worked by hand: every response runs to the cap at a fixed cost per engine
    step, so a batch takes G = 4096 x 2 ms. Bound 0 (on-policy) is G + T per step; bound 1 overlaps a batch with the
    training of the one before: (G + T) / 2 while G > T, and the trainer's T once T > G."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("model_async", f"{REPO}/benchmarks/model_async.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    flat = model.parse_curve("1:2,512:2")
    g = 4096 * 0.002

    def step(train_s, bound):
        return model.simulate(flat, train_s, bound=bound, batch=8, clip=1.0, steps=8)

    assert step(4.0, 0)["s/step"] == pytest.approx(g + 4.0, rel=1e-3)
    assert step(4.0, 1)["s/step"] == pytest.approx((g + 4.0) / 2, rel=1e-3)
    assert step(10.0, 1)["s/step"] == pytest.approx(10.0, rel=1e-3)
    assert step(4.0, 1)["G"] == pytest.approx(g, rel=1e-3)
    assert model.step_cost(model.parse_curve("1:1,3:3"), 2) == pytest.approx(0.002)  # between the curve's points


def test_check_names_the_rollout_pool_and_its_engines():
    from rlx.trainer.check import describe

    cfg = load_config(DISAGG + ["rollout.n_gpus_per_node=2", "rollout.engines_per_gpu=2"])
    world = next(line for line in describe(cfg, make_plan(cfg, vllm_installed=lambda: False)).splitlines()
                 if line.strip().startswith("world"))
    assert world.endswith("; the rollout on its own 1 node(s) x 2 GPU(s) x 2 engine(s) each = 4 rank(s)"), world
