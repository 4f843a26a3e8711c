"""End-to-end half of tests/unit/test_reward_model.py: its tests that start Ray or other processes, or need a GPU.
That file's docstring says what is tested; its helpers and fixtures are imported from it."""
from __future__ import annotations
import pytest
import torch
from rlx.reward.rm_inputs import place_scores, retemplated
from rlx.plan import make_plan
from unit.test_reward_model import (  # noqa: F401 -- helpers and fixtures shared with the unit tests
    RM,
    _reference_scores,
    _tokenizer,
)


@pytest.mark.slow
def test_ppo_scored_by_a_reward_model_through_ray(ray_local, tmp_path):
    """PPO with a critic and a reward model (2 CPU workers per role): the scores the trainer uses are the reward
    model's, read on each response's own conversation; one training step reports them as critic/score/*."""
    from conftest import load_config
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    cfg = load_config(["algorithm.adv_estimator=gae", "reward_model.enable=True", f"reward_model.model.path={RM}",
                       "reward_model.micro_batch_size_per_gpu=3", "reward_model.model.use_remove_padding=True",
                       "trainer.total_training_steps=1", "data.train_batch_size=4", "trainer.val_before_train=False",
                       "trainer.test_freq=-1", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                       "actor_rollout_ref.rollout.name=hf", f"trainer.default_local_dir={tmp_path}"])
    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    try:
        trainer.init_workers()
        prompts = trainer.train_loader.next_batch()
        batch = trainer.generate(prompts, validate=False)
        metrics: dict = {}
        scores, _ = trainer.score(batch, metrics)
        # the reference: each row's conversation in the reward model's template, scored alone by HF's model
        actor, rm = _tokenizer("builtin://tiny-qwen2"), _tokenizer(RM)
        texts = retemplated(batch, actor, rm, max_length=10_000)
        rows = [ids[m.bool()].tolist() for ids, m in zip(texts["input_ids"], texts["attention_mask"])]
        expected = place_scores(_reference_scores(rows), batch["response_mask"])
        torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-5)
        assert scores.abs().sum() > 0
        history = trainer.fit()
    finally:
        trainer.shutdown()
    assert len(history) == 1
    step = history[0]
    assert "critic/score/mean" in step and "critic/vf_loss" in step
    assert step["critic/score/mean"] != 0.0


@pytest.mark.slow
def test_reward_model_on_its_own_pool_scores_as_colocated(ray_local, tmp_path):
    """reward_model.enable_resource_pool=True: the reward model's ranks sit in a placement group of their own
    (reward_model.nnodes x n_gpus_per_node bundles, whole bundles), not on the actor's; the scores are the same."""
    from ray.util.placement_group import placement_group_table

    from conftest import load_config
    from rlx.trainer.ppo_trainer import RayPPOTrainer

    cfg = load_config(["reward_model.enable=True", f"reward_model.model.path={RM}", "trainer.n_gpus_per_node=1",
                       "reward_model.enable_resource_pool=True", "reward_model.nnodes=1",
                       "reward_model.n_gpus_per_node=1", "reward_model.micro_batch_size_per_gpu=3",
                       "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                       "trainer.val_before_train=False", "actor_rollout_ref.rollout.name=hf",
                       f"trainer.default_local_dir={tmp_path}"])
    trainer = RayPPOTrainer(cfg, make_plan(cfg))
    try:
        trainer.init_workers()
        assert trainer.rm.pool is not trainer.actor.pool and trainer.rm.world_size == 1
        assert (trainer.actor.pool.roles, trainer.rm.pool.roles) == (1, 1)  # the actor alone; the reward model alone
        tables = placement_group_table()
        assert tables[trainer.rm.pool.pg.id.hex()]["bundles"] == {0: {"CPU": 1.0}}
        assert trainer.rm.pool.pg.id != trainer.actor.pool.pg.id
        batch = trainer.generate(trainer.train_loader.next_batch(), validate=False)
        scores, _ = trainer.score(batch, {})
        actor, rm = _tokenizer("builtin://tiny-qwen2"), _tokenizer(RM)
        texts = retemplated(batch, actor, rm, max_length=10_000)
        rows = [ids[m.bool()].tolist() for ids, m in zip(texts["input_ids"], texts["attention_mask"])]
        torch.testing.assert_close(scores, place_scores(_reference_scores(rows), batch["response_mask"]),
                                   rtol=1e-4, atol=1e-5)
    finally:
        trainer.shutdown()
