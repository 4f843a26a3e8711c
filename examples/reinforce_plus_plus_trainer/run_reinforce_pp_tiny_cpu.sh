#!/usr/bin/env bash
# REINFORCE++ (Hu 2025, https://arxiv.org/abs/2501.03262), verl's keys: no critic; token returns (gamma 1) whitened
# over the batch, with the KL to the reference folded into the reward (algorithm.use_kl_in_reward) and the PPO clip
# loss. Scaled to this CPU (built-in tiny model, synthetic digits task, 2 workers); the values of a GPU run (verl's
# examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh) are in the comments. For REINFORCE++-baseline
# (the group mean subtracted first) set algorithm.adv_estimator=reinforce_plus_plus_baseline.
#
#   bash examples/reinforce_plus_plus_trainer/run_reinforce_pp_tiny_cpu.sh [key=value ...]   # PYTHON= picks the python
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)

"$PYTHON" -m rlx.trainer.main_ppo --config-name quickstart \
    algorithm.adv_estimator=reinforce_plus_plus \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_penalty=kl \
    algorithm.kl_ctrl.kl_coef=0.001 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.kl_loss_type=mse \
    data.train_files=synthetic://digits/size:2048/seed:0 \
    data.val_files=synthetic://digits/size:64/seed:1 \
    data.train_batch_size=16 \
    data.max_prompt_length=16 \
    data.max_response_length=16 \
    actor_rollout_ref.model.path=builtin://tiny-qwen2 \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.name=hf \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    trainer.device=cpu \
    trainer.n_gpus_per_node=2 \
    trainer.total_training_steps=20 \
    trainer.test_freq=10 \
    trainer.logger=[console] \
    "$@"
# GPU (Qwen2-7B-Instruct on GSM8K + MATH, 16 GPUs): data.train_batch_size=1024 data.max_prompt_length=1024
#   data.max_response_length=1024 actor_rollout_ref.actor.optim.lr=3e-6 actor_rollout_ref.actor.ppo_mini_batch_size=1024
#   actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.n=8
#   actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=2
#   actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.ref.fsdp_config.param_offload=True
#   actor_rollout_ref.model.path=<model> data.train_files=<parquet> trainer.device=cuda trainer.n_gpus_per_node=16
#   trainer.total_epochs=15
