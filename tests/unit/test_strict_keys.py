"""Keys that used to be accepted and ignored, or that misbehaved: one test each (the accounting of every key is
tests/unit/test_config_keys.py)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from ranks import end_rank
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


# ---- vLLM engine arguments: schema defaults, trust_remote_code, load_format ---------------------------------
def _engine_args(device="cpu", trust_remote_code=False, **cfg):
    from rlx.workers.rollout.vllm_rollout import VLLMRollout

    r = VLLMRollout.__new__(VLLMRollout)
    r.cfg = RolloutConfig(**cfg)
    r.model_path, r.device, r.dtype, r.trust_remote_code = "/nonexistent", device, "float32", trust_remote_code
    r.rank, r.world_size, r.tp, r.dp_rank = 0, 1, 1, 0
    r.max_prompt_length, r.max_response_length, r.free_cache_engine = 16, 16, True
    return r._engine_args({"kv_cache_memory_bytes": 1 << 20})


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
    from unit.test_batch_shaping import _actor, make_batch

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
        end_rank()


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


def test_select_generations_is_verls_choice():
    from rlx.trainer.validation import select_generations

    samples = [(f"p{i}", f"r{i}", float(i)) for i in range(10)]
    first = select_generations(samples, 3)
    assert len(first) == 3 and first == select_generations(list(reversed(samples)), 3)  # order-independent
    assert select_generations(samples, 20) != samples and sorted(select_generations(samples, 20)) == samples


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
