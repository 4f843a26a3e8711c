"""The algorithm keys verl accepts validate as verl's do, and the rules around them name the key, the value and the
fix (rlx/config/validate.py, before Ray starts)."""
import pytest

from rlx.algos.advantages import ADV_ESTIMATORS
from rlx.algos.core_algos import KL_PENALTY_TYPES, LOSS_AGG_MODES
from rlx.algos.policy_losses import LOSS_MODES

from conftest import load_config  # the quickstart job's config

PL = "actor_rollout_ref.actor.policy_loss"
NEEDS = {"optimal_token_baseline": ["actor_rollout_ref.actor.calculate_sum_pi_squared=True"],
         "tir_optimal_token_baseline": ["actor_rollout_ref.actor.calculate_sum_pi_squared=True"],
         "gdpo": ["algorithm.gdpo_reward_keys=[accuracy,format]"]}


def err(*overrides) -> str:
    with pytest.raises(ValueError) as e:
        load_config(list(overrides))
    return str(e.value)


@pytest.mark.parametrize("estimator", ADV_ESTIMATORS)
def test_every_estimator_is_accepted(estimator):
    cfg = load_config([f"algorithm.adv_estimator={estimator}", *NEEDS.get(estimator, [])])
    assert cfg.algorithm.adv_estimator == estimator


@pytest.mark.parametrize("mode", LOSS_MODES)
def test_every_loss_mode_is_accepted(mode):
    cfg = load_config([f"{PL}.loss_mode={mode}", f"{PL}.dro_beta=0.1"])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == mode


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_every_aggregation_is_accepted_for_actor_and_critic(agg):
    cfg = load_config([f"actor_rollout_ref.actor.loss_agg_mode={agg}", "algorithm.adv_estimator=gae",
                       "actor_rollout_ref.actor.loss_scale_factor=512"])
    assert cfg.critic.loss_agg_mode == agg and cfg.critic.loss_scale_factor == 512  # the critic follows the actor


@pytest.mark.parametrize("kind", KL_PENALTY_TYPES)
def test_every_kl_form_is_accepted(kind):
    cfg = load_config([f"actor_rollout_ref.actor.kl_loss_type={kind}", f"algorithm.kl_penalty={kind}"])
    assert cfg.algorithm.kl_penalty == kind


def test_verls_policy_loss_defaults():
    a = load_config([]).actor_rollout_ref.actor
    p = a.policy_loss
    assert (p.loss_mode, p.clip_cov_ratio, p.clip_cov_lb, p.clip_cov_ub, p.kl_cov_ratio, p.ppo_kl_coef, p.dro_beta) \
        == ("vanilla", 0.0002, 1.0, 5.0, 0.0002, 0.1, None)
    assert (a.tau_pos, a.tau_neg, a.loss_scale_factor, a.calculate_sum_pi_squared) == (1.0, 1.05, None, False)


def test_rules_name_the_key_and_the_fix():
    assert f"{PL}.loss_mode='ppo2' is not valid" in err(f"{PL}.loss_mode=ppo2")
    assert f"{PL}.dro_beta=0.1" in err(f"{PL}.loss_mode=dro")  # the fix
    assert "clip_cov_ratio=0.0 must be > 0" in err(f"{PL}.loss_mode=clip_cov", f"{PL}.clip_cov_ratio=0")
    assert "calculate_sum_pi_squared=True" in err("algorithm.adv_estimator=optimal_token_baseline")
    assert "algorithm.gdpo_reward_keys=" in err("algorithm.adv_estimator=gdpo")
    assert "one weight per" in err("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[a,b]",
                                   "algorithm.gdpo_reward_weights=[1.0]")
    assert "rollout.n >= 2" in err("algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=1")
    assert "loss_scale_factor=0 must be > 0" in err("actor_rollout_ref.actor.loss_scale_factor=0")
    assert "kl_loss_type='k3++' is not valid" in err("actor_rollout_ref.actor.kl_loss_type=k3++")
