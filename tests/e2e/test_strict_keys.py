"""End-to-end half of tests/unit/test_strict_keys.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import pytest
import torch
from rlx.config.schema import RolloutConfig
from rlx.protocol import Batch
from conftest import load_config  # the quickstart job's config
from unit.test_strict_keys import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    _engine_args,
    _prefetch_worker,
    _validating_trainer,
    err,
)


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


def test_vllm_engine_args_follow_the_config():
    args = _engine_args()
    assert args["max_num_seqs"] == RolloutConfig().max_num_seqs == 256  # the schema's (verl's), not a code default
    assert args["trust_remote_code"] is False and args["load_format"] == "dummy"  # verl's default
    assert _engine_args(load_format="dummy_dtensor")["load_format"] == "dummy"  # verl's older name of the same
    assert _engine_args(trust_remote_code=True)["trust_remote_code"] is True
    assert _engine_args(load_format="safetensors")["load_format"] == "safetensors"
    assert "load_format=" in err("actor_rollout_ref.rollout.load_format=megatron")
    assert "actor_rollout_ref.rollout.dtype" in err("actor_rollout_ref.rollout.dtype=int8")


def test_fsdp2_forward_prefetch_is_applied_and_changes_no_number():
    from conftest import free_port as _free_port

    torch.multiprocessing.spawn(_prefetch_worker, args=(1, _free_port()), nprocs=1, join=True)


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
