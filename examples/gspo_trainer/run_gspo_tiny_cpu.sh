#!/usr/bin/env bash
# GSPO (Zheng et al. 2025, https://arxiv.org/abs/2507.18071), verl's keys: GRPO advantages with the sequence-level
# importance ratio (policy_loss.loss_mode=gspo), its tiny clip ranges (3e-4 / 4e-4, the paper's Sec. 5.1), the
# sequence-mean loss, no KL. Scaled to this CPU (built-in tiny model, synthetic digits task, 2 workers); the values
# of a GPU run (verl's examples/gspo_trainer/test_gspo_3b_math.sh) are in the comments.
#
#   bash examples/gspo_trainer/run_gspo_tiny_cpu.sh [key=value ...]     # PYTHON=/some/python to pick the interpreter
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)

"$PYTHON" -m rlx.trainer.main_ppo --config-name quickstart \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.policy_loss.loss_mode=gspo \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \
    actor_rollout_ref.actor.clip_ratio_low=0.0003 \
    actor_rollout_ref.actor.clip_ratio_high=0.0004 \
    actor_rollout_ref.actor.use_kl_loss=False \
    algorithm.use_kl_in_reward=False \
    data.train_files=synthetic://digits/size:2048/seed:0 \
    data.val_files=synthetic://digits/size:64/seed:1 \
    data.train_batch_size=16 \
    data.max_prompt_length=16 \
    data.max_response_length=16 \
    actor_rollout_ref.model.path=builtin://tiny-qwen2 \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.name=hf \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    trainer.device=cpu \
    trainer.n_gpus_per_node=2 \
    trainer.total_training_steps=20 \
    trainer.test_freq=10 \
    trainer.logger=[console] \
    "$@"
# GPU (Qwen2.5-3B on math): data.train_batch_size=512 actor_rollout_ref.actor.ppo_mini_batch_size=128 (4
#   mini-batches per step, as the paper) actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
#   actor_rollout_ref.rollout.n=16 data.max_prompt_length=2048 data.max_response_length=8192
#   actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.use_dynamic_bsz=True
#   actor_rollout_ref.rollout.name=vllm actor_rollout_ref.model.path=<model> data.train_files=<parquet>
#   trainer.device=cuda trainer.n_gpus_per_node=8 trainer.total_epochs=10
