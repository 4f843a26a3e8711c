"""Checkpoints: exact resume of FSDP1/FSDP2 actor engines over 2-rank gloo, HF export, crash safety, rotation."""
from __future__ import annotations

import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from rlx import checkpoint as ckpt
from rlx.checkpoint import engine_state
from rlx.config.schema import TrainerConfig

WORLD = 2


def _model_cfg(**override_config):
    from rlx.config.schema import ModelConfig

    return ModelConfig(path="builtin://tiny-qwen2", enable_gradient_checkpointing=False, use_remove_padding=False,
                       override_config=override_config)


def _engine(strategy: str, **override_config):
    from rlx.config.schema import ActorConfig, FSDPConfig, OptimConfig
    from rlx.engine.actor import ActorEngine

    # warm-up makes the lr differ per step, so a scheduler that is not restored shows in the params
    actor_cfg = ActorConfig(strategy=strategy, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
                            optim=OptimConfig(lr=1e-2, lr_warmup_steps=3))
    model_cfg = _model_cfg(**override_config)
    return ActorEngine(role="actor", model_cfg=model_cfg, actor_cfg=actor_cfg,
                       fsdp_cfg=FSDPConfig(), strategy=strategy, device=torch.device("cpu"), world_size=WORLD,
                       rollout_n=2, temperature=1.0, total_steps=10)


def _train_step(engine, step: int, rank: int):
    """One PPO update on a fixed per-(step, rank) batch; returns (log-probs before the update, metrics)."""
    from rlx.protocol import Batch

    g = torch.Generator().manual_seed(100 * step + rank)
    prompt, resp = 4, 6
    ids = torch.randint(3, 259, (2, prompt + resp), generator=g)
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                   "position_ids": torch.arange(prompt + resp).expand(2, -1).clone(),
                   "responses": ids[:, prompt:], "response_mask": torch.ones(2, resp),
                   "advantages": torch.randn(2, resp, generator=g)})
    lp = engine.compute_log_prob(batch, 2)["log_probs"]
    metrics = engine.update_policy(batch.union(Batch({"old_log_probs": lp - 0.05})))
    return lp, metrics


def _full_params(engine) -> dict:
    from rlx.engine.weights import iter_full_params

    return {k: v.clone() for k, v in iter_full_params(engine.module, to_cpu=True)}


def _check(rank: int, strategy: str, root: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    barrier = torch.distributed.barrier
    trainer_cfg = TrainerConfig(resume_mode="auto", default_local_dir=root, resume_from_path=None)
    a = _engine(strategy)
    _train_step(a, 1, rank)
    d1 = ckpt.step_dir(root, 1)
    ckpt.save_engine(a, os.path.join(d1, "actor"), hf_export=True)
    if rank == 0:
        ckpt.save_driver_state(d1, {"global_step": 1})
        ckpt.mark_complete(d1)
        ckpt.write_latest(root, 1)
    barrier()

    # (2) the HF export: same weights, same logits as the FSDP model
    ids = torch.tensor([[5, 17, 42, 99, 7, 250, 3, 64]])
    a.train_mode(False)
    with torch.no_grad():
        # the engine's model scores chosen positions: every next token of `ids` here
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        fsdp_lp, _ = a.module(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids),
                              index=torch.arange(ids.shape[1] - 1), targets=ids[0, 1:])
    full1 = _full_params(a)
    if rank == 0:
        hf_dir = os.path.join(d1, "actor", ckpt.HF_DIR)
        with open(os.path.join(hf_dir, "config.json")) as f:  # what vLLM dispatches on (not FSDP's subclass)
            assert json.load(f)["architectures"] == ["Qwen2ForCausalLM"]
        assert os.path.exists(os.path.join(hf_dir, "model.safetensors"))
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        hf_sd = hf.state_dict()
        assert set(hf_sd) >= set(full1), set(full1) - set(hf_sd)
        for k, v in full1.items():
            assert torch.equal(hf_sd[k], v), k
        with torch.no_grad():
            hf_lp = torch.log_softmax(hf(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            torch.testing.assert_close(hf_lp, fsdp_lp, rtol=1e-5, atol=1e-5)
        assert AutoTokenizer.from_pretrained(hf_dir).decode([40, 41]) is not None
    rand_after_save = torch.rand(4)
    lr_after_save = a.lr_scheduler.get_last_lr()

    lp2, m2 = _train_step(a, 2, rank)
    params2 = _full_params(a)

    # (1) a fresh engine loads step 1 and repeats step 2 exactly
    b = _engine(strategy)
    torch.manual_seed(1234 + rank)
    ckpt.load_engine(b, os.path.join(d1, "actor"))
    assert torch.equal(torch.rand(4), rand_after_save), "torch RNG not restored"
    assert b.lr_scheduler.get_last_lr() == lr_after_save
    lp2b, m2b = _train_step(b, 2, rank)
    assert torch.equal(lp2, lp2b), "log-probs after load differ"
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert m2[k] == m2b[k], (k, m2[k], m2b[k])
    params2b = _full_params(b)
    for k, v in params2.items():
        assert torch.equal(v, params2b[k]), f"param {k} differs after resume"
    assert any(not torch.equal(v, full1[k]) for k, v in params2.items()), "step 2 changed nothing"

    # (3) a save that dies after the model part: no COMPLETE, resume falls back to step 1
    d2 = ckpt.step_dir(root, 2)

    def boom(*args, **kwargs):
        raise RuntimeError("injected failure")

    orig = engine_state._save_optimizer
    engine_state._save_optimizer = boom
    try:
        with pytest.raises(RuntimeError, match="injected"):
            ckpt.save_engine(b, os.path.join(d2, "actor"))
    finally:
        engine_state._save_optimizer = orig
    barrier()
    assert os.path.isdir(os.path.join(d2, "actor", "model")) and not ckpt.is_complete(d2)
    if rank == 0:
        ckpt.write_latest(root, 2)  # even a pointer naming the broken step is not trusted
    barrier()
    assert ckpt.find_resume_dir(trainer_cfg) == d1
    # saving the same step again replaces the partial one
    ckpt.save_engine(b, os.path.join(d2, "actor"))
    if rank == 0:
        ckpt.mark_complete(d2)
    barrier()
    assert ckpt.find_resume_dir(trainer_cfg) == d2
    c = _engine(strategy)
    ckpt.load_engine(c, os.path.join(d2, "actor"))
    for k, v in _full_params(c).items():
        assert torch.equal(v, params2b[k]), k

    # (4) meta.json records the model as the preflight describes it (built on the meta device); a model with a
    # layer less is refused at load by key (before: loaded, the last layer silently dropped)
    from rlx.engine.architecture import expected

    with open(os.path.join(d2, "actor", "meta.json")) as f:
        assert json.load(f)["model"] == c.architecture == expected(_model_cfg(), "actor")
    small = _engine(strategy, num_hidden_layers=3)
    with pytest.raises(ValueError, match=r"saved from another model: \d+ saved keys the model does not have"):
        ckpt.load_engine(small, os.path.join(d2, "actor"))


# ---------------------------------------------------------------------------------------------- driver side
def _fake_step(root, step, parts=("actor", "critic"), complete=True):
    d = ckpt.step_dir(root, step)
    for p in parts:
        os.makedirs(os.path.join(d, p))
    if complete:
        ckpt.mark_complete(d)
    return d


def test_rotate_keeps_newest(tmp_path):
    root = str(tmp_path)
    for s in range(1, 6):
        _fake_step(root, s)
    _fake_step(root, 6, complete=False)  # a crashed save newer than every complete step is left alone
    assert ckpt.rotate(root, None, "actor") == [] and ckpt.rotate(root, 0, "critic") == []
    removed = ckpt.rotate(root, 2, "actor")
    assert sorted(removed) == [os.path.join(ckpt.step_dir(root, s), "actor") for s in (1, 2, 3)]
    assert ckpt.list_steps(root) == [4, 5]  # a step that lost its actor is no longer resumable
    ckpt.rotate(root, 3, "critic")
    assert ckpt.list_steps(root, complete_only=False) == [3, 4, 5, 6]  # steps 1, 2 had nothing left
    assert os.path.isdir(os.path.join(ckpt.step_dir(root, 3), "critic"))
    assert os.path.isdir(os.path.join(ckpt.step_dir(root, 6), "actor"))
    with pytest.raises(ValueError):
        ckpt.rotate(root, 1, "ref")


def test_find_resume_dir_modes(tmp_path):
    root = str(tmp_path / "ckpts")
    cfg = TrainerConfig(resume_mode="auto", default_local_dir=root, resume_from_path=None)
    assert ckpt.find_resume_dir(cfg) is None  # no root yet
    d3 = _fake_step(root, 3)
    _fake_step(root, 10)
    d12 = _fake_step(root, 12, complete=False)
    ckpt.write_latest(root, 12)
    assert open(os.path.join(root, ckpt.LATEST)).read() == "12"
    assert ckpt.find_resume_dir(cfg) == ckpt.step_dir(root, 10)  # numeric order, incomplete 12 ignored
    cfg.resume_mode = "disable"
    assert ckpt.find_resume_dir(cfg) is None
    cfg.resume_mode, cfg.resume_from_path = "resume_path", d3
    assert ckpt.find_resume_dir(cfg) == d3
    for bad in (str(tmp_path / "nope"), None, d12):
        cfg.resume_from_path = bad
        with pytest.raises(ValueError, match="trainer.resume_from_path"):
            ckpt.find_resume_dir(cfg)
    cfg.resume_mode = "sometimes"
    with pytest.raises(ValueError, match="trainer.resume_mode"):
        ckpt.find_resume_dir(cfg)


def test_an_incomplete_step_is_named_once_at_resume(tmp_path, caplog):
    """Issue 51: a step folder without COMPLETE (a save that did not finish) is skipped with one line naming it
    (before: without a word); complete steps are not named."""
    root = str(tmp_path / "ckpts")
    _filled_step(root, 6)
    d7 = ckpt.step_dir(root, 7)
    os.makedirs(os.path.join(d7, "actor", "model"))
    with caplog.at_level("INFO", logger="rlx"):
        assert ckpt.find_resume_dir(_auto(root)) == ckpt.step_dir(root, 6)
    lines = [r.getMessage() for r in caplog.records if "incomplete" in r.getMessage()]
    assert lines == [f"rlx: step 7 is incomplete: skipped ({d7} has no COMPLETE marker: its save did not finish)"], \
        caplog.text
    assert "step 6" not in caplog.text


def test_driver_state_round_trip(tmp_path):
    import numpy as np

    state = {"global_step": 7, "kl_ctrl_value": 0.0123,
             "dataloader": {"epoch": 1, "position": 3, "gen": torch.ByteTensor([1, 2, 255]),
                            "perm": np.arange(4), "py": (3, (1, 2), None)}}
    ckpt.save_driver_state(str(tmp_path), state)
    back = ckpt.load_driver_state(str(tmp_path))
    assert back["global_step"] == 7 and back["kl_ctrl_value"] == 0.0123
    dl = back["dataloader"]
    assert torch.equal(dl["gen"], state["dataloader"]["gen"]) and dl["gen"].dtype == torch.uint8
    assert (dl["perm"] == np.arange(4)).all() and dl["py"] == (3, (1, 2), None)
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


class _RecordingPart:
    """A worker group as the manager sees it: writes a file where it saves, and notes what it loads."""

    def __init__(self, name, events):
        self.name, self.events = name, events

    def save(self, path):
        assert not os.path.exists(os.path.join(os.path.dirname(path), ckpt.COMPLETE)), "the parts come first"
        os.makedirs(path)
        with open(os.path.join(path, "weights"), "w") as f:
            f.write(self.name)
        self.events.append(("save", self.name, path))

    def load(self, path):
        self.events.append(("load", self.name, path))


def test_manager_saves_whole_steps_rotates_and_resumes(tmp_path):
    """One call per save: every part, the driver state, COMPLETE (verifying), the latest pointer, then rotation of
    each part by its own keep count; one call per resume: each part loaded, the driver state returned."""
    root = str(tmp_path / "ckpts")
    cfg = TrainerConfig(default_local_dir=root, max_actor_ckpt_to_keep=1, max_critic_ckpt_to_keep=2)
    manager, events = ckpt.CheckpointManager(cfg), []
    parts = {"actor": _RecordingPart("actor", events), "critic": _RecordingPart("critic", events)}
    for step in (1, 2, 3):
        d = manager.save(step, parts, {"global_step": step, "gen": torch.tensor([step])})
        assert d == ckpt.step_dir(root, step) and ckpt.verify(d) == []
        assert open(os.path.join(root, ckpt.LATEST)).read() == str(step)
    assert [e[:2] for e in events[:2]] == [("save", "actor"), ("save", "critic")]
    assert ckpt.list_steps(root) == [3]  # steps 1, 2 lost their actor: no longer resumable
    assert os.path.isdir(os.path.join(ckpt.step_dir(root, 2), "critic"))  # the critic keeps two
    assert not os.path.exists(ckpt.step_dir(root, 1))

    events.clear()
    assert manager.resume(None, parts) is None and events == []
    state = manager.resume(ckpt.step_dir(root, 3), parts)
    assert state["global_step"] == 3 and torch.equal(state["gen"], torch.tensor([3]))
    assert events == [("load", n, os.path.join(ckpt.step_dir(root, 3), n)) for n in ("actor", "critic")]


# ---------------------------------------------------------------------------------------------- integrity
def _filled_step(root, step):
    """A complete step with real-looking files: a model shard, an extra state, the driver state."""
    d = ckpt.step_dir(root, step)
    os.makedirs(os.path.join(d, "actor", "model"))
    with open(os.path.join(d, "actor", "model", "__0_0.distcp"), "wb") as f:
        f.write(os.urandom(4096))
    torch.save({"rng": torch.get_rng_state()}, os.path.join(d, "actor", "extra_rank0.pt"))
    ckpt.save_driver_state(d, {"global_step": step})
    ckpt.mark_complete(d)
    return d


def _auto(root, on_damaged="previous"):
    return TrainerConfig(resume_mode="auto", default_local_dir=root, resume_from_path=None,
                         on_damaged_checkpoint=on_damaged)


def _overwrite(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 16)  # same size, different bytes (what NaN weights written over a shard look like)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage,rel", [
    (_overwrite, "actor/model/__0_0.distcp"),
    (_truncate, "actor/model/__0_0.distcp"),
    (_truncate, "actor/extra_rank0.pt"),
    (lambda p: open(p, "w").write("{broken"), "driver_state.json"),
    (os.remove, "actor/model/__0_0.distcp"),
])
def test_damaged_checkpoint_resumes_from_the_previous_one(tmp_path, caplog, damage, rel):
    root = str(tmp_path)
    d1, d2 = _filled_step(root, 1), _filled_step(root, 2)
    assert ckpt.verify(d2) == []
    damage(os.path.join(d2, rel))
    problems = ckpt.verify(d2)
    assert len(problems) == 1 and problems[0].startswith(rel), problems
    with caplog.at_level("WARNING", logger="rlx"):
        assert ckpt.find_resume_dir(_auto(root)) == d1
    assert d2 in caplog.text and rel in caplog.text and f"resuming from the previous complete checkpoint {d1}" \
        in caplog.text
    with pytest.raises(ckpt.DamagedCheckpointError, match=rel):
        ckpt.find_resume_dir(_auto(root, on_damaged="error"))
    cfg = TrainerConfig(resume_mode="resume_path", resume_from_path=d2, default_local_dir=root)
    with pytest.raises(ckpt.DamagedCheckpointError, match="trainer.resume_from_path"):
        ckpt.find_resume_dir(cfg)


def test_never_resumes_from_an_unverifiable_checkpoint(tmp_path):
    root = str(tmp_path)
    d1 = _filled_step(root, 1)
    with open(os.path.join(d1, ckpt.COMPLETE), "w"):
        pass  # an empty marker, as older versions wrote: nothing to verify against
    assert "cannot be verified" in ckpt.verify(d1)[0]
    with pytest.raises(ckpt.DamagedCheckpointError, match="resume_mode=disable"):
        ckpt.find_resume_dir(_auto(root))  # none verifies: an error, never a silent fresh start


def test_unreadable_driver_state_names_the_file(tmp_path):
    d = _filled_step(str(tmp_path), 1)
    with open(os.path.join(d, ckpt.DRIVER_STATE), "w") as f:
        f.write('{"global_step": ')
    with pytest.raises(ckpt.DamagedCheckpointError, match="driver_state.json.*resume_from_path"):
        ckpt.load_driver_state(d)


def test_hf_export_is_readable_by_others(tmp_path, tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    ckpt.export_hf(model, str(tmp_path / "hf"))
    modes = {f: os.stat(tmp_path / "hf" / f).st_mode & 0o777 for f in os.listdir(tmp_path / "hf")}
    assert modes and all(m & 0o044 == 0o044 for m in modes.values()), {f: oct(m) for f, m in modes.items()}
