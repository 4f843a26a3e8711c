"""End-to-end half of tests/unit/test_plan.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import dataclasses
import pytest
from rlx.plan import ACTOR_GROUP, CRITIC_GROUP, REWARD_MODEL_GROUP, TRAINER_POOL, JudgePlan, Pool, make_plan
from conftest import load_config  # the quickstart job: GRPO, 2 workers
from unit.test_plan import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    CPU,
    JUDGE,
    RM,
    plan_of,
)


# ---------------------------------------------------------------------------------------------- make_plan
def test_grpo_builds_the_actor_alone_on_one_colocated_pool():
    plan = plan_of(["actor_rollout_ref.rollout.name=hf"])
    r = plan.roles
    assert (r.actor, r.rollout, r.ref, r.critic, r.reward_model, r.judge) == (True, True, False, False, False, False)
    assert plan.judge is None
    p = plan.placement
    assert p.device == "cpu" and p.pools == {TRAINER_POOL: Pool(1, 2)} and p.groups == {ACTOR_GROUP: TRAINER_POOL}
    assert p.sharing(TRAINER_POOL) == 1 and p.bundles == 2 and p.pool_of(ACTOR_GROUP).world_size == 2
    assert (plan.rollout.engine, plan.rollout.tensor_parallel_size, plan.rollout.note) == ("hf", 1, None)
    assert (plan.rollout.mode, plan.rollout.agent_loop) == ("sync", False)


def test_ppo_with_gae_adds_a_critic_on_the_same_pool():
    plan = plan_of(["algorithm.adv_estimator=gae"])
    assert plan.roles.critic and not plan.roles.ref
    assert plan.placement.groups == {ACTOR_GROUP: TRAINER_POOL, CRITIC_GROUP: TRAINER_POOL}
    assert plan.placement.sharing(TRAINER_POOL) == 2 and plan.placement.bundles == 2


@pytest.mark.parametrize("kl", ["actor_rollout_ref.actor.use_kl_loss=True", "algorithm.use_kl_in_reward=True"])
def test_a_kl_term_builds_the_reference_policy(kl):
    plan = plan_of([kl])
    assert plan.roles.ref and not plan.roles.critic
    assert plan.placement.groups == {ACTOR_GROUP: TRAINER_POOL}  # the ref lives in the actor's processes


def test_a_reward_model_scores_unless_a_custom_function_does(tmp_path):
    plan = plan_of(RM)
    assert plan.roles.reward_model and not plan.roles.judge and plan.judge is None
    assert plan.placement.groups[REWARD_MODEL_GROUP] == TRAINER_POOL and plan.placement.sharing(TRAINER_POOL) == 2
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    custom = plan_of(RM + [f"custom_reward_function.path={reward}"])  # verl's precedence: the function scores
    assert not custom.roles.reward_model and REWARD_MODEL_GROUP not in custom.placement.groups
    judged = plan_of(JUDGE + [f"custom_reward_function.path={reward}"])  # a judge runs next to a custom function
    assert judged.roles.reward_model and judged.roles.judge


def test_the_judge_generates_with_its_own_engine_or_the_rollouts():
    plan = plan_of(JUDGE + ["reward_model.rollout.name=hf"], vllm=True)
    assert plan.roles.judge and plan.judge == JudgePlan(engine="hf", tensor_parallel_size=1)
    assert plan.rollout.engine == "vllm" and plan.uses_vllm
    follows = plan_of(JUDGE + ["actor_rollout_ref.rollout.name=hf"], vllm=True)  # null: the rollout's engine
    assert follows.judge.engine == "hf" and not follows.uses_vllm
    cfg = load_config(CPU + JUDGE + ["reward_model.rollout.name=vllm"])
    cfg = dataclasses.replace(cfg, reward_model=dataclasses.replace(cfg.reward_model, rollout=dataclasses.replace(
        cfg.reward_model.rollout, tensor_model_parallel_size=2)))  # (needs GPUs: set past validation)
    assert make_plan(cfg, vllm_installed=lambda: True).judge == JudgePlan(engine="vllm", tensor_parallel_size=2)


def test_the_reward_model_on_a_pool_of_its_own():
    plan = plan_of(RM + ["reward_model.enable_resource_pool=True", "reward_model.nnodes=1",
                         "reward_model.n_gpus_per_node=3"])
    p = plan.placement
    assert p.pools == {TRAINER_POOL: Pool(1, 2), "reward_model": Pool(1, 3)}
    assert p.groups[REWARD_MODEL_GROUP] == "reward_model" and p.pool_of(REWARD_MODEL_GROUP).world_size == 3
    assert (p.sharing(TRAINER_POOL), p.sharing("reward_model"), p.bundles) == (1, 1, 5)
    # without a reward model that scores, the key reserves nothing
    none = plan_of(["reward_model.enable_resource_pool=True", "reward_model.nnodes=1",
                    "reward_model.n_gpus_per_node=3"])
    assert none.placement.pools == {TRAINER_POOL: Pool(1, 2)}


def test_rollout_name_auto_picks_vllm_when_installed():
    assert load_config(CPU).actor_rollout_ref.rollout.name == "auto"
    with_vllm = plan_of(vllm=True)
    assert with_vllm.rollout.engine == "vllm" and with_vllm.rollout.note is None
    without = plan_of(vllm=False)
    assert without.rollout.engine == "hf" and "vLLM is not installed" in without.rollout.note
    assert plan_of(["actor_rollout_ref.rollout.name=hf"], vllm=True).rollout.engine == "hf"
    # tensor parallelism is vLLM's: hf generates on every rank alone
    cfg = load_config(CPU)
    r = cfg.actor_rollout_ref.rollout
    cfg = dataclasses.replace(cfg, actor_rollout_ref=dataclasses.replace(
        cfg.actor_rollout_ref, rollout=dataclasses.replace(r, tensor_model_parallel_size=2)))
    assert make_plan(cfg, vllm_installed=lambda: True).rollout.tensor_parallel_size == 2
    assert make_plan(cfg, vllm_installed=lambda: False).rollout.tensor_parallel_size == 1


def test_async_mode_runs_the_agent_loop():
    plan = plan_of(["actor_rollout_ref.rollout.mode=async"])
    assert plan.rollout.mode == "async" and plan.rollout.agent_loop
