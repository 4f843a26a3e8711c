"""Keys that used to be accepted and ignored, or that misbehaved: one test each (the accounting of every key is
tests/test_config_keys.py)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from rlx.config.schema import RolloutConfig
from rlx.protocol import Batch

from conftest import load_config  # the quickstart job's config


def err(*overrides) -> str:
    with pytest.raises(ValueError) as e:
        load_config(list(overrides))
    return str(e.value)


# ---- rollout.ignore_eos --------------------------------------------------------------------------------------
def _eos_model_rollout(tiny_model_path, ignore_eos: bool):
    """An HF rollout whose model emits token 0 at every step (zero output layer, greedy), token 0 being EOS."""
    from rlx.workers.rollout.hf_rollout import HFRollout

    rollout = HFRollout(tiny_model_path, max_response_length=6, pad_token_id=1, eos_token_id=0,
                        device=torch.device("cpu"), ignore_eos=ignore_eos)
    with torch.no_grad():
        rollout.model.lm_head.weight.zero_()
    return rollout


def test_ignore_eos_gives_max_length_responses_hf(tiny_model_path):
    prompts = Batch({"input_ids": torch.tensor([[1, 5, 6], [7, 8, 9]]), "attention_mask": torch.tensor([[0, 1, 1],
                                                                                                       [1, 1, 1]])},
                    meta={"n": 2, "do_sample": False, "temperature": 0.0})
    stops = _eos_model_rollout(tiny_model_path, ignore_eos=False).generate_sequences(prompts)
    assert stops["response_mask"].sum(-1).tolist() == [1, 1, 1, 1]  # EOS first, then nothing
    full = _eos_model_rollout(tiny_model_path, ignore_eos=True).generate_sequences(prompts)
    assert full["response_mask"].sum(-1).tolist() == [6, 6, 6, 6]
    assert (full["responses"] == 0).all()  # EOS tokens, kept and unmasked


def test_assemble_output_ignore_eos_keeps_tokens_after_eos():
    from rlx.workers.rollout.base import assemble_output

    prompts, mask = torch.tensor([[3, 4]]), torch.ones(1, 2, dtype=torch.long)
    responses = torch.tensor([[5, 2, 6, 7]])  # EOS (2) second
    assert assemble_output(prompts, mask, responses, 2, 0)["response_mask"].tolist() == [[1, 1, 0, 0]]
    out = assemble_output(prompts, mask, responses, 2, 0, ignore_eos=True)
    assert out["response_mask"].tolist() == [[1, 1, 1, 1]] and out["responses"].tolist() == [[5, 2, 6, 7]]


def test_vllm_sampling_params_ignore_eos():
    pytest.importorskip("vllm")
    from rlx.workers.rollout.vllm_rollout import VLLMRollout

    r = VLLMRollout.__new__(VLLMRollout)
    r.cfg, r.max_response_length, r.eos_token_id, r.dp_rank, r.calculate_log_probs = RolloutConfig(), 8, 2, 0, False
    for ignore in (False, True):
        r.ignore_eos = ignore
        params, *_ = r._sampling_params({"n": 2, "do_sample": True, "temperature": 1.0, "seed": 1}, 1)
        assert params[0].ignore_eos is ignore and params[0].max_tokens == 8
        assert params[0].stop_token_ids == ([] if ignore else [2])


# ---- vLLM engine arguments: schema defaults, trust_remote_code, load_format ---------------------------------
def _engine_args(device="cpu", trust_remote_code=False, **cfg):
    from rlx.workers.rollout.vllm_rollout import VLLMRollout

    r = VLLMRollout.__new__(VLLMRollout)
    r.cfg = RolloutConfig(**cfg)
    r.model_path, r.device, r.dtype, r.trust_remote_code = "/nonexistent", device, "float32", trust_remote_code
    r.rank, r.world_size, r.tp, r.dp_rank = 0, 1, 1, 0
    r.max_prompt_length, r.max_response_length, r.free_cache_engine = 16, 16, True
    return r._engine_args({"kv_cache_memory_bytes": 1 << 20})


def test_vllm_engine_args_follow_the_config():
    args = _engine_args()
    assert args["max_num_seqs"] == RolloutConfig().max_num_seqs == 256  # the schema's (verl's), not a code default
    assert args["trust_remote_code"] is False and args["load_format"] == "dummy"  # verl's default
    assert _engine_args(load_format="dummy_dtensor")["load_format"] == "dummy"  # verl's older name of the same
    assert _engine_args(trust_remote_code=True)["trust_remote_code"] is True
    assert _engine_args(load_format="safetensors")["load_format"] == "safetensors"
    assert "load_format=" in err("actor_rollout_ref.rollout.load_format=megatron")
    assert "actor_rollout_ref.rollout.dtype" in err("actor_rollout_ref.rollout.dtype=int8")


def test_vllm_rollout_receives_trust_remote_code(monkeypatch):
    """The worker hands actor_rollout_ref.model.trust_remote_code to the vLLM rollout (it reached only the HF
    loaders before)."""
    import rlx.workers.rollout as rollout_pkg
    from rlx.workers.actor_worker import ActorRolloutRefWorker

    seen = {}
    monkeypatch.setattr(rollout_pkg, "build_rollout", lambda name, **kw: seen.update(kw, name=name))
    cfg = load_config(["actor_rollout_ref.model.trust_remote_code=True", "trainer.device=cpu"])
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.cfg, worker.rank, worker.world_size, worker.device = cfg, 0, 2, torch.device("cpu")
    worker._build_rollout("vllm")
    assert seen["name"] == "vllm" and seen["trust_remote_code"] is True
    worker._build_rollout("hf")
    assert seen["name"] == "hf" and seen["trust_remote_code"] is True and seen["ignore_eos"] is False


def test_available_memory_is_measured_not_assumed(monkeypatch):
    import psutil

    from rlx.workers.rollout import vllm_rollout

    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"available": 123})())
    assert vllm_rollout._available_memory_bytes() == 123


# ---- checkpoint.save_contents --------------------------------------------------------------------------------
@pytest.mark.parametrize("contents,exports", [("[model,optimizer,extra]", False),
                                              ("[model,optimizer,extra,hf_model]", True), (None, True)])
def test_actor_hf_export_follows_save_contents(monkeypatch, contents, exports):
    """The actor's HF export is written when save_contents has hf_model (rlx's actor default), never otherwise."""
    from rlx.checkpoint import engine_state
    from rlx.workers.actor_worker import ActorRolloutRefWorker

    seen = {}
    monkeypatch.setattr(engine_state, "save_engine", lambda engine, path, contents, **kw: seen.update(kw, contents=contents))
    overrides = [f"actor_rollout_ref.actor.checkpoint.save_contents={contents}"] if contents else []
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.cfg, worker.actor, worker.tokenizer = load_config(overrides), object(), None
    worker.save_checkpoint("/nonexistent")
    assert ("hf_model" in seen["contents"]) is exports and "hf_export" not in seen


# ---- fsdp_config.forward_prefetch (FSDP2) and offload_policy (FSDP2 only) ------------------------------------
def _prefetch_worker(rank, world, port):
    from test_batch_shaping import _actor, make_batch

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        batch = make_batch(rows=4)
        plain = _actor("fsdp2", [])
        prefetch = _actor("fsdp2", ["actor_rollout_ref.actor.fsdp_config.forward_prefetch=True"])
        layers = [m for m in prefetch.module.modules() if type(m).__name__ == "Qwen2DecoderLayer"]
        assert [m._get_fsdp_state()._states_to_forward_prefetch for m in layers[:-1]] == \
            [[nxt._get_fsdp_state()] for nxt in layers[1:]]
        assert torch.equal(plain.compute_log_prob(batch, 2)["log_probs"], prefetch.compute_log_prob(batch, 2)["log_probs"])
        assert plain.update_policy(batch)["actor/pg_loss"] == prefetch.update_policy(batch)["actor/pg_loss"]
    finally:
        torch.distributed.destroy_process_group()


def test_fsdp2_forward_prefetch_is_applied_and_changes_no_number():
    from test_batch_shaping import _free_port

    torch.multiprocessing.spawn(_prefetch_worker, args=(1, _free_port()), nprocs=1, join=True)


def test_offload_policy_is_fsdp2_only():
    msg = err("actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.fsdp_config.offload_policy=True")
    assert "actor_rollout_ref.actor.fsdp_config.offload_policy=True is FSDP2's CPUOffloadPolicy" in msg
    load_config(["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.offload_policy=True"])
    from rlx.config.schema import FSDPConfig
    from rlx.engine.fsdp import apply_fsdp

    with pytest.raises(ValueError, match="offload_policy=True is FSDP2's"):  # engines built without the validator
        apply_fsdp(torch.nn.Linear(2, 2), "fsdp", FSDPConfig(offload_policy=True), torch.device("cpu"))


# ---- validation: statistics over each prompt's n samples, trainer.log_val_generations -------------------------
class _Tracker:
    def __init__(self):
        self.generations = []

    def log_generations(self, samples, step):
        self.generations.append((step, samples))


def _validating_trainer(overrides, scores):
    """A trainer whose validation set is 2 prompts, each answered with n responses scored `scores[prompt][j]`."""
    import numpy as np

    from rlx.models import build_byte_tokenizer
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    t = RayPPOTrainer.__new__(RayPPOTrainer)
    t.cfg = load_config(overrides)
    n = t.cfg.actor_rollout_ref.rollout.val_kwargs.n
    t.tokenizer, t.tracker, t.val_history, t.global_step = build_byte_tokenizer(), _Tracker(), [], 3
    t.val_loader = [None]
    flat = [s for row in scores for s in row]
    responses = torch.tensor([[65 + i, 66] for i in range(len(flat))])
    t.generate = lambda prompts, validate: Batch(
        {"responses": responses, "response_mask": torch.ones_like(responses)},
        {"data_source": ["src"] * len(flat), "uid": np.repeat(["a", "b"], n),
         "raw_prompt": np.repeat(["prompt a", "prompt b"], n)})

    def score(batch):
        out = torch.zeros(len(flat), 2)
        out[:, -1] = torch.tensor(flat)
        return out, {}

    t.score = score
    return t


def test_val_metrics_at_n_are_per_prompt_statistics():
    t = _validating_trainer(["actor_rollout_ref.rollout.val_kwargs.n=3", "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
                             "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"], [[0.0, 1.0, 0.5], [1.0, 1.0, 1.0]])
    out = t.validate()
    assert out["val/src/reward/mean"] == pytest.approx(0.75)
    assert out["val/src/reward/best@3"] == pytest.approx(1.0)  # max of each prompt's 3, averaged
    assert out["val/src/reward/worst@3"] == pytest.approx(0.5)
    assert out["val/src/reward/std@3"] == pytest.approx((float(torch.tensor([0.0, 1.0, 0.5]).std(unbiased=False))) / 2)
    assert "val/src/reward/mean@3" not in out  # it would equal mean
    assert t.tracker.generations == []  # trainer.log_val_generations=0


def test_log_val_generations_picks_that_many_samples():
    t = _validating_trainer(["trainer.log_val_generations=2"], [[0.25], [1.0]])
    t.validate()
    [(step, samples)] = t.tracker.generations
    assert step == 3 and len(samples) == 2
    decode = t.tokenizer.decode
    assert sorted(samples) == [("prompt a", decode([65, 66]), 0.25), ("prompt b", decode([66, 66]), 1.0)]


def test_select_generations_is_verls_choice():
    from rlx.trainer.validation import select_generations

    samples = [(f"p{i}", f"r{i}", float(i)) for i in range(10)]
    first = select_generations(samples, 3)
    assert len(first) == 3 and first == select_generations(list(reversed(samples)), 3)  # order-independent
    assert select_generations(samples, 20) != samples and sorted(select_generations(samples, 20)) == samples


def test_tracker_prints_generations(tmp_path, capsys):
    from rlx.trainer.tracking import Tracker

    cfg = load_config(["trainer.logger=[console,file]"])
    tracker = Tracker(cfg, str(tmp_path))
    tracker.log_generations([("1 2 ->", "2", 1.0), ("3 ->", "x", 0.0)], step=5)
    out = capsys.readouterr().out
    assert "validation generations at step 5 (2)" in out and "[1] [response] 'x'" in out
    import json

    [line] = (tmp_path / "val_generations.jsonl").read_text().splitlines()
    assert json.loads(line)["samples"][0] == {"input": "1 2 ->", "output": "2", "score": 1.0}
    tracker.close()


# ---- trainer.balance_batch ------------------------------------------------------------------------------------
def test_balance_batch_gives_each_rank_equal_rows_and_balanced_tokens():
    from rlx.trainer.ppo_trainer import RayPPOTrainer
    from rlx.engine.packing import equal_size_partition

    lengths = [9, 1, 8, 2, 7, 3, 6, 4]
    groups = equal_size_partition(lengths, 2)
    assert sorted(len(g) for g in groups) == [4, 4] and sorted(i for g in groups for i in g) == list(range(8))
    assert [sum(lengths[i] for i in g) for g in groups] == [20, 20]

    t = RayPPOTrainer.__new__(RayPPOTrainer)
    t.world_size = 2
    mask = torch.tensor([[1] * n + [0] * (9 - n) for n in [9, 8, 7, 6, 1, 2, 3, 4]])
    batch = Batch({"attention_mask": mask}, {"uid": list("abcdefgh")})
    for on in (True, False):
        t.cfg, metrics = load_config([f"trainer.balance_batch={on}"]), {}
        out = t.balance_batch(batch, metrics)
        if not on:
            assert out is batch and metrics == {}
            continue
        halves = [out["attention_mask"][:4].sum().item(), out["attention_mask"][4:].sum().item()]
        assert halves == [20, 20] and sorted(out["uid"]) == list("abcdefgh")  # rows move with their fields
        assert metrics["global_seqlen/minmax_diff"] == 30 - 10 and metrics["global_seqlen/balanced_max"] == 20


# ---- model.custom_chat_template, critic.model.tokenizer_path (checked before Ray) ------------------------------
def test_custom_chat_template_formats_the_prompts():
    from rlx.trainer.preflight import preflight

    template = "{% for m in messages %}<<{{ m.content }}>>{% endfor %}"
    inputs = preflight(load_config([f"actor_rollout_ref.model.custom_chat_template='{template}'",
                                    "data.max_prompt_length=24"]))
    assert inputs.tokenizer.chat_template == template
    assert all(inputs.train_dataset[i]["raw_prompt"].startswith("<<") for i in range(4))
    assert not preflight(load_config([])).train_dataset[0]["raw_prompt"].startswith("<<")


def test_critic_tokenizer_must_share_the_vocabulary(tmp_path, tiny_model_path):
    from rlx.models import build_byte_tokenizer
    from rlx.trainer.preflight import PreflightError, preflight

    same, other = tmp_path / "same", tmp_path / "other"
    build_byte_tokenizer().save_pretrained(same)
    extended = build_byte_tokenizer()
    extended.add_tokens(["<extra_token>"])
    extended.save_pretrained(other)
    for d in (same, other):  # a tokenizer directory as HF writes one for a model (with its config)
        shutil.copy(os.path.join(tiny_model_path, "config.json"), d / "config.json")
    gae = ["algorithm.adv_estimator=gae"]
    preflight(load_config(gae + [f"critic.model.tokenizer_path={same}"]))
    with pytest.raises(PreflightError) as e:
        preflight(load_config(gae + [f"critic.model.tokenizer_path={other}"]))
    assert f"critic.model.tokenizer_path='{other}' has a different vocabulary" in str(e.value)


# ---- ray_init.timeline_json_file --------------------------------------------------------------------------------
def test_timeline_json_file_is_written(monkeypatch, tmp_path):
    import ray

    from rlx.trainer.launch import write_timeline

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "timeline", lambda filename: calls.append(filename))
    write_timeline(load_config([]))
    assert calls == []
    target = tmp_path / "sub" / "timeline.json"
    write_timeline(load_config([f"ray_init.timeline_json_file={target}"]))
    assert calls == [str(target)] and target.parent.is_dir()


# ---- end to end through Ray: a custom reward column, logged validation generations, ignore_eos -----------------
def test_reward_column_generations_and_ignore_eos_end_to_end(ray_local, tmp_path, capsys):
    """verl rows whose reward-picking column is `task` (data.reward_fn_key=task) train and validate; each validation
    prints trainer.log_val_generations=2 samples; rollout.ignore_eos=True gives max-length responses."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlx.data import synthetic
    from rlx.plan import make_plan
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    for name, size in (("train", 8), ("val", 3)):
        rows = [{("task" if k == "data_source" else k): v for k, v in row.items()}
                for row in synthetic.generate_rows(f"synthetic://digits/size:{size}/seed:{size}")]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet")
    cfg = load_config([f"data.train_files={tmp_path}/train.parquet", f"data.val_files={tmp_path}/val.parquet",
                       "data.reward_fn_key=task", "trainer.log_val_generations=2",
                       "actor_rollout_ref.rollout.ignore_eos=True", "actor_rollout_ref.rollout.name=hf",
                       "data.max_response_length=6", "trainer.total_training_steps=1", "data.train_batch_size=4",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.logger=[console]",
                       f"trainer.default_local_dir={tmp_path}/out"])
    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    try:
        [metrics] = trainer.fit()
    finally:
        trainer.shutdown()
    out = capsys.readouterr().out
    assert out.count("validation generations at step") == 2  # before training and after the last step
    assert out.count("[1] [prompt] ") == 2 and "[2] [prompt] " not in out
    assert metrics["response_length/mean"] == metrics["response_length/min"] == 6  # ignore_eos: all max length
    assert "val/synthetic/digits/reward/mean" in metrics and "critic/score/mean" in metrics


def test_engine_kwargs_of_another_engine_are_refused():
    load_config(["actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
                 "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=null"])  # verl's inert default
    assert "engine_kwargs.sglang={'attention_backend': 'fa3'} configures another engine" in \
        err("actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3")


def test_clip_ratio_sets_both_bounds_unless_they_are_given():
    """As in verl, clip_ratio_low/high default to 0.2, so clip_ratio alone changes nothing; set to null they follow
    clip_ratio."""
    from rlx.algos.core_algos import compute_policy_loss

    assert load_config(["actor_rollout_ref.actor.clip_ratio=0.5"]).actor_rollout_ref.actor.clip_ratio_low == 0.2
    actor = load_config(["actor_rollout_ref.actor.clip_ratio=0.5", "actor_rollout_ref.actor.clip_ratio_low=null",
                         "actor_rollout_ref.actor.clip_ratio_high=null"]).actor_rollout_ref.actor
    assert actor.clip_ratio_low is None and actor.clip_ratio_high is None
    ratio = torch.tensor([[1.4, 0.7]])  # inside a 0.5 clip range, outside a 0.2 one
    kw = dict(old_log_prob=torch.zeros(1, 2), log_prob=ratio.log(), advantages=torch.tensor([[1.0, -1.0]]),
              response_mask=torch.ones(1, 2), cliprange=actor.clip_ratio, cliprange_low=actor.clip_ratio_low,
              cliprange_high=actor.clip_ratio_high)
    assert compute_policy_loss(**kw)[1] == 0  # no token clipped at 0.5
    assert compute_policy_loss(**dict(kw, cliprange_low=0.2, cliprange_high=0.2))[1] > 0
