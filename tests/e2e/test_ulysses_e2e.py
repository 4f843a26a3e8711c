"""Ulysses end to end through the entry point's trainer: Ray, 2 CPU worker ranks over gloo, the HF rollout, offload
+ checkpointing + tiled MLP (GRPO) or tiled decoder layers (PPO) + fused head + packed rows on actor, ref and
critic, 2 steps. A run with
`ulysses_sequence_parallel_size=2` (one group of 2 ranks sharing every row) and one with 1 (2 data-parallel
ranks) on the same seed have the same step-1 metrics (same rollout, same old log-probs, same update: one
mini-batch per step, since more would group different rows into them at sp=1 and sp=2, as in verl)."""
import pytest

from e2e.test_e2e import assert_trained, train

LONG = ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_activation_offload=True", "critic.model.enable_activation_offload=True",
        "actor_rollout_ref.model.activation_offload.min_tensor_bytes=0",
        "critic.model.activation_offload.min_tensor_bytes=0",
        "actor_rollout_ref.model.tile_mlp_tokens=16", "critic.model.tile_mlp_tokens=16",
        "actor_rollout_ref.actor.use_kl_loss=True", "trainer.logger=[console]",
        # one mini-batch per step: its rows are the same whether 2 ranks or one group of 2 split the batch
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4"]
SP2 = ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
       "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2"]
STEP1 = ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm", "critic/score/mean",
         "response_length/mean")
CRITIC = ("critic/vf_loss", "critic/grad_norm", "critic/values/mean", "critic/advantages/mean")


# PPO runs the tiled decoder layers instead of the tiled MLP (actor, ref and critic)
LAYER = [o.replace("tile_mlp_tokens", "tile_layer_tokens") for o in LONG] + \
    ["actor_rollout_ref.model.enable_gradient_checkpointing=True", "critic.model.enable_gradient_checkpointing=True"]


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_sp2_matches_sp1_end_to_end(ray_local, tmp_path, estimator):
    runs = {}
    common = LONG if estimator == "grpo" else LAYER
    for sp, extra in ((1, []), (2, SP2)):
        history, before, after = train([f"algorithm.adv_estimator={estimator}"] + common + extra, tmp_path / f"sp{sp}")
        assert_trained(history, before, after, critic=estimator == "gae")
        runs[sp] = history[0]
    keys = STEP1 + (CRITIC if estimator == "gae" else ())
    for k in keys:
        a, b = runs[2][k], runs[1][k]
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), f"{k}: sp=2 {a} vs sp=1 {b}"
    print({k: (runs[1][k], runs[2][k]) for k in keys})
