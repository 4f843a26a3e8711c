"""The error lines a wrong value gets name the key, the value and the fix, before anything starts: a value of the
wrong type is one `rlx:` line with the type the key takes; a non-positive batch size is refused plainly (no talk of
its divisors); a strategy rlx does not have is refused only for the roles the job builds."""
from __future__ import annotations

import pytest

from conftest import refusal
from rlx.trainer.main_ppo import main

WRONG_TYPES = {  # override -> (the value as the line shows it, the type the key takes)
    "data.train_batch_size=abc": ("'abc'", "an integer"),
    "actor_rollout_ref.actor.optim.lr=fast": ("'fast'", "a number"),
    "data.train_batch_size=[1,2]": ("[1,2]", "an integer"),
    "actor_rollout_ref.actor.use_kl_loss=maybe": ("'maybe'", "true or false"),
    "actor_rollout_ref.rollout.n=null": ("null", "an integer"),
    "trainer.total_training_steps=x": ("'x'", "an integer or null"),
    "trainer.logger=3": ("3", "a list"),
    "actor_rollout_ref.model.override_config=3": ("3", "a mapping"),
    "actor_rollout_ref.actor.optim=3": ("3", "a section of keys"),  # OmegaConf names no key for this one
}


@pytest.mark.parametrize("override", sorted(WRONG_TYPES))
def test_a_value_of_the_wrong_type_is_one_line_with_the_key_the_value_the_type_and_the_fix(capsys, override):
    code = main(["--config-name", "quickstart", "--check", override])
    out, err = capsys.readouterr()
    key = override.split("=", 1)[0]
    shown, wants = WRONG_TYPES[override]
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"rlx: {key}={shown} is not valid: {key} takes {wants}"), line
    assert f"Fix: {key}" in line, line
    assert "reference_type" not in line and "full_key" not in line, line


def test_a_wrong_type_also_fails_cfg_job_in_one_line(capsys):
    code = main(["--config-name", "quickstart", "--cfg", "job", "data.train_batch_size=abc"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "rlx: data.train_batch_size='abc' is not valid: data.train_batch_size takes an integer. "
        "Fix: data.train_batch_size=<an integer> (the default: 1024)."]


@pytest.mark.parametrize("value", ["-1", "0"])
def test_a_non_positive_train_batch_size_is_refused_first_and_plainly(value):
    problems = refusal([f"data.train_batch_size={value}"]).split("\n  - ")
    assert problems[0] == (f"data.train_batch_size={value} must be a positive integer. "
                           f"Fix: data.train_batch_size=<a positive integer>.")
    assert not any("divisor" in p or "divide" in p for p in problems), problems


@pytest.mark.parametrize("overrides,key", [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=-1"], "actor_rollout_ref.actor.ppo_mini_batch_size"),
    (["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=0"], "critic.ppo_mini_batch_size"),
    (["data.val_batch_size=-1"], "data.val_batch_size"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=-2"], "actor_rollout_ref.actor.ppo_micro_batch_size"),
])
def test_other_non_positive_batch_sizes_are_refused_plainly(overrides, key):
    problems = refusal(overrides).split("\n  - ")
    mine = [p for p in problems if p.startswith(f"{key}=")]
    assert mine and "must be a positive integer" in mine[0] and "Fix:" in mine[0], problems
    assert "divisors of" not in mine[0] and "leaves 0 per GPU" not in mine[0], mine


def test_megatron_is_refused_for_the_actor_only_in_a_grpo_job_without_kl():
    problems = refusal(["actor_rollout_ref.actor.strategy=megatron"]).split("\n  - ")
    strategy = [p for p in problems if "megatron" in p]
    assert len(strategy) == 1 and strategy[0].startswith("actor_rollout_ref.actor.strategy='megatron'"), problems


def test_megatron_is_refused_for_the_ref_with_a_kl_loss_and_for_the_critic_with_gae():
    grpo = refusal(["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.use_kl_loss=True"])
    assert "actor_rollout_ref.ref.strategy='megatron'" in grpo and "critic." not in grpo
    ppo = refusal(["actor_rollout_ref.actor.strategy=megatron", "algorithm.adv_estimator=gae"])
    assert "critic.strategy='megatron'" in ppo and "Fix: critic.strategy=fsdp2" in ppo
