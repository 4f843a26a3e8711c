"""Where verl accepts a command, rlx accepts it and computes what verl computes: the ref's micro-batch size only when a
ref is built, GRPO / RLOO with one response per prompt, verl's deprecated global micro-batch keys (derived per GPU as
verl's workers derive them), `trainer.use_legacy_worker_impl`."""
import numpy as np
import pytest
import torch

from rlx.algos.advantages import compute_advantage
from rlx.config.verl_compat import DEPRECATED
from rlx.trainer.main_ppo import main

from conftest import load_config  # the quickstart job: GRPO, n=4, world 2, actor micro-batch 8 per GPU


def refused(*overrides) -> str:
    with pytest.raises(ValueError) as e:
        load_config(list(overrides))
    return str(e.value)


# ---- the ref's micro-batch size -----------------------------------------------------------------------------------
def test_ref_micro_batch_is_needed_only_when_a_ref_is_built():
    cfg = load_config(["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null"])  # no KL: no ref
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu is None
    for kl in ("actor_rollout_ref.actor.use_kl_loss=True", "algorithm.use_kl_in_reward=True"):
        msg = refused("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null", kl)
        assert "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=None must be a positive integer" in msg, kl


# ---- one response per prompt --------------------------------------------------------------------------------------
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_of_one_is_accepted(estimator):
    cfg = load_config([f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=1"])
    assert cfg.actor_rollout_ref.rollout.n == 1


def test_rollout_n_below_one_is_refused():
    assert "actor_rollout_ref.rollout.n=0 must be >= 1" in refused("actor_rollout_ref.rollout.n=0")


def test_advantage_of_groups_of_one_is_verls():
    """n=1: every prompt uid holds one response. verl's GRPO takes mean 0 and std 1 for such a group, so the
    advantage is score / (1 + epsilon) (score alone without the std division); RLOO keeps the score."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, -0.5, 0.0], [3.0, 0.0, 0.0]])  # scores 1, -0.5, 3
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    uids = np.array(["a", "b", "c"], dtype=object)
    scores = [1.0, -0.5, 3.0]
    expected = {
        ("grpo", True): [s / (1 + 1e-6) for s in scores],
        ("grpo", False): scores,
        ("rloo", True): scores,
    }
    for (estimator, norm), per_row in expected.items():
        adv, ret = compute_advantage(estimator, token_level_rewards=rewards, response_mask=mask, index=uids,
                                        norm_adv_by_std_in_grpo=norm)
        want = torch.tensor(per_row, dtype=torch.float32)[:, None] * mask
        torch.testing.assert_close(adv, want, rtol=1e-7, atol=0, msg=f"{estimator} norm={norm}")  # float32 ulps
        torch.testing.assert_close(ret, want, rtol=1e-7, atol=0)


# ---- deprecated global micro-batch keys ---------------------------------------------------------------------------
SP2_WORLD4 = ["trainer.n_gpus_per_node=4", "actor_rollout_ref.model.use_remove_padding=True",
              "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.actor.use_kl_loss=True",
              "algorithm.adv_estimator=gae", "critic.model.use_remove_padding=True",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null"]


def test_deprecated_keys_are_divided_by_the_data_parallel_size():
    """verl's workers: per GPU = global // (world size // sp), the actor's sp for actor, rollout and ref, the
    critic's for the critic. World 4, actor sp 2 (2 groups), critic sp 1 (4 groups)."""
    notes: list[str] = []
    from rlx.config import load_config as load

    cfg = load(SP2_WORLD4 + ["actor_rollout_ref.actor.ppo_micro_batch_size=16",
                             "actor_rollout_ref.rollout.log_prob_micro_batch_size=32",
                             "actor_rollout_ref.ref.log_prob_micro_batch_size=12",
                             "critic.ppo_micro_batch_size=8", "critic.forward_micro_batch_size=20"],
               config_name="quickstart", notes=notes)
    arr = cfg.actor_rollout_ref
    assert arr.actor.ppo_micro_batch_size_per_gpu == 8  # 16 // (4 // 2)
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 16  # 32 // 2
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 6  # 12 // 2 (the actor's sp, as verl's worker divides)
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 2  # 8 // (4 // 1)
    assert cfg.critic.forward_micro_batch_size_per_gpu == 5  # 20 // 4
    notes = [n for n in notes if " is deprecated" in n]  # (a note on CPU workers may come first on a small machine)
    assert [n.split(" is deprecated")[0] for n in notes] == [
        "rlx: note: actor_rollout_ref.actor.ppo_micro_batch_size=16",
        "rlx: note: actor_rollout_ref.rollout.log_prob_micro_batch_size=32",
        "rlx: note: actor_rollout_ref.ref.log_prob_micro_batch_size=12",
        "rlx: note: critic.ppo_micro_batch_size=8", "rlx: note: critic.forward_micro_batch_size=20"]
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 (16 // 2 data-parallel groups" in notes[0]


def test_critic_forward_follows_the_derived_critic_micro_batch():
    """verl's critic.forward_micro_batch_size defaults to critic.ppo_micro_batch_size: both divide alike."""
    cfg = load_config(["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size=6",
                       "critic.ppo_micro_batch_size_per_gpu=null"])
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 3 and cfg.critic.forward_micro_batch_size_per_gpu == 3


@pytest.mark.parametrize("key", sorted(DEPRECATED))
def test_each_deprecated_key_sets_its_replacement(key):
    cfg = load_config([f"{key}=8", f"{DEPRECATED[key]}=null"])  # quickstart: world 2, sp 1
    obj = cfg
    for part in DEPRECATED[key].split("."):
        obj = getattr(obj, part)
    assert obj == 4


@pytest.mark.parametrize("key", sorted(DEPRECATED))
def test_deprecated_key_and_its_replacement_together_are_refused(key):
    msg = refused(f"{key}=8", f"{DEPRECATED[key]}=3")
    assert f"{key}=8 and {DEPRECATED[key]}=3 are both set" in msg and f"remove {key}" in msg


def test_deprecated_key_smaller_than_the_data_parallel_size_is_refused():
    msg = refused("actor_rollout_ref.actor.ppo_micro_batch_size=1",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size=1 is deprecated" in msg
    assert "2 data-parallel groups" in msg and "leaves 0 per GPU" in msg


def test_deprecated_key_unused_with_dynamic_batch_size_is_dropped_with_a_note():
    notes: list[str] = []
    from rlx.config import load_config as load

    cfg = load(["actor_rollout_ref.actor.ppo_micro_batch_size=64", "actor_rollout_ref.actor.use_dynamic_bsz=True"],
               config_name="quickstart", notes=notes)
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8  # the quickstart's, untouched
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size is None
    assert any("unused here (actor_rollout_ref.actor.use_dynamic_bsz=True)" in n for n in notes), notes


def test_the_entry_point_prints_the_note(capsys):
    code = main(["--config-name", "quickstart", "actor_rollout_ref.rollout.log_prob_micro_batch_size=32",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("rlx: note:")]
    assert len(notes) == 1 and "Use that key" in notes[0], err
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16" in notes[0]
    assert "log-prob micro-batch 16 per GPU" in out


# ---- trainer.use_legacy_worker_impl -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["auto", "enable", "disable"])
def test_legacy_worker_impl_accepts_verls_values(value):
    assert load_config([f"trainer.use_legacy_worker_impl={value}"]).trainer.use_legacy_worker_impl == value


def test_legacy_worker_impl_refuses_other_values():
    msg = refused("trainer.use_legacy_worker_impl=yes")
    assert "trainer.use_legacy_worker_impl='yes' is not valid; choose one of ['auto', 'enable', 'disable']" in msg


def test_too_small_critic_key_says_so_even_when_its_per_gpu_key_follows_the_actor():
    msg = refused("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size=1")  # per GPU: the actor's 8
    assert "critic.ppo_micro_batch_size=1 is deprecated" in msg and "leaves 0 per GPU" in msg
    assert "both set" not in msg
