#!/usr/bin/env bash
# Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", https://arxiv.org/abs/2503.20783), verl's keys:
# GRPO without the std in the advantage and with the token-sum loss over a constant (seq-mean-token-sum-norm, no
# length bias), no KL loss. Scaled to this CPU (built-in tiny model, synthetic digits task, 2 workers); the values
# of a GPU run (verl's docs/algo/grpo.md and examples/grpo_trainer) are in the comments.
#
#   bash examples/grpo_trainer/run_drgrpo_tiny_cpu.sh [key=value ...]     # PYTHON=/some/python to pick the interpreter
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)

"$PYTHON" -m rlx.trainer.main_ppo --config-name quickstart \
    algorithm.adv_estimator=grpo \
    algorithm.norm_adv_by_std_in_grpo=False \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \
    actor_rollout_ref.actor.loss_scale_factor=16 \
    actor_rollout_ref.actor.use_kl_loss=False \
    algorithm.use_kl_in_reward=False \
    data.train_files=synthetic://digits/size:2048/seed:0 \
    data.val_files=synthetic://digits/size:64/seed:1 \
    data.train_batch_size=16 \
    data.max_prompt_length=16 \
    data.max_response_length=16 \
    actor_rollout_ref.model.path=builtin://tiny-qwen2 \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
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
# GPU (Qwen2.5-7B on GSM8K + MATH, 8 GPUs): data.train_batch_size=1024 data.max_prompt_length=1024
#   data.max_response_length=1024 actor_rollout_ref.actor.loss_scale_factor=1024 (the max response length)
#   actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=256
#   actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.name=vllm
#   actor_rollout_ref.rollout.n=5 actor_rollout_ref.model.path=<model> data.train_files=<parquet> trainer.device=cuda
#   trainer.n_gpus_per_node=8 trainer.total_epochs=15
