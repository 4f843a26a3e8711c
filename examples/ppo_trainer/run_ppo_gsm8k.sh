#!/usr/bin/env bash
# PPO (GAE with a critic) on GSM8K with vLLM rollout and activation offload on the actor and the critic (GPU).
#
# Data: $HOME/data/gsm8k/{train,test}.parquet in verl's row format, made (offline) by
#   .venv/bin/python scripts/prepare_gsm8k.py --input_dir <dir with train.jsonl/test.jsonl> --output_dir ~/data/gsm8k
# Model: any local HF directory; MODEL_PATH defaults to $HOME/models/Qwen2.5-0.5B-Instruct (the critic starts
# from the same weights, with a value head).
#
#   MODEL_PATH=/path/to/Qwen2.5-0.5B-Instruct N_GPUS=8 bash examples/ppo_trainer/run_ppo_gsm8k.sh trainer.total_epochs=3
#
# Micro-batches here hold at most 16-32k tokens, where whole decoder layers are fastest, so layer tiling stays off;
# for responses of 100k+ tokens append actor_rollout_ref.model (and critic.model).tile_layer_tokens=8192 and
# activation_offload.prefetch_layers=1 (docs/offload.md, "Tiled decoder layers"). The pinned host pool is sized
# before the first update from data.max_*_length and the token budgets (activation_offload.reserve_pool).
#
# Extra key=value arguments are appended (a later key wins). On a Ray cluster, submit the same command with
# `ray job submit` (docs/ray_cluster.md).
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
MODEL_PATH="${MODEL_PATH:-$HOME/models/Qwen2.5-0.5B-Instruct}"
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k}"
N_GPUS="${N_GPUS:-1}"
NNODES="${NNODES:-1}"

"$PYTHON" -m rlx.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=1.0 \
    algorithm.use_kl_in_reward=False \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.model.enable_activation_offload=True \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.use_fused_kernels=True \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16 \
    critic.strategy=fsdp2 \
    critic.optim.lr=1e-5 \
    critic.model.path="$MODEL_PATH" \
    critic.model.enable_gradient_checkpointing=True \
    critic.model.enable_activation_offload=True \
    critic.model.use_remove_padding=True \
    critic.use_dynamic_bsz=True \
    critic.ppo_max_token_len_per_gpu=32768 \
    critic.forward_max_token_len_per_gpu=32768 \
    critic.model.fsdp_config.param_offload=False \
    critic.model.fsdp_config.optimizer_offload=False \
    critic.model.fsdp_config.mixed_precision.param_dtype=bf16 \
    critic.ppo_micro_batch_size_per_gpu=8 \
    critic.forward_micro_batch_size_per_gpu=16 \
    trainer.device=cuda \
    trainer.critic_warmup=0 \
    trainer.logger='[console,tensorboard]' \
    trainer.project_name=rlx_ppo_gsm8k \
    trainer.experiment_name=qwen2.5_0.5b_gae_offload \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.val_before_train=True \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_training_steps=null \
    trainer.total_epochs=3 \
    "$@"
