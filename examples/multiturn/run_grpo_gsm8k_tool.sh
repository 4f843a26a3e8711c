#!/usr/bin/env bash
# GRPO on GSM8K with a tool (verl's multi-turn GSM8K recipe): the model may call calc_gsm8k_reward to check its
# answer; the reward counts the final answer. Agent loop (tool_agent) over vLLM, activation offload on (GPU).
#
# Data: $HOME/data/gsm8k_tool/{train,test}.parquet, verl's tool-agent rows, made (offline) by
#   .venv/bin/python scripts/prepare_gsm8k.py --multi-turn --input_dir <dir with train.jsonl/test.jsonl> \
#       --output_dir ~/data/gsm8k_tool
# Model: an instruct model whose chat template has a tool role (Qwen2.5-*-Instruct); MODEL_PATH defaults to
# $HOME/models/Qwen2.5-0.5B-Instruct.
# Without instruct weights: tests/gpu/gpu_tool_recipe.sh (random weights + scripts/sft_tool_format.py's format warm
# start, then this recipe for 3 steps).
#
#   MODEL_PATH=/path/to/Qwen2.5-0.5B-Instruct N_GPUS=1 bash examples/multiturn/run_grpo_gsm8k_tool.sh \
#       trainer.total_epochs=1
#
# Metrics of the agent loop: agent/num_turns/*, agent/tool_calls/mean, agent/tool_errors/mean,
# agent/assistant_tokens/mean, agent/tool_tokens/mean, agent/tool_wait_s/* (docs/agent.md).
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOL_CONFIG="$ROOT/examples/multiturn/config/tool_config/gsm8k_tool_config.yaml"  # verl's tool YAML
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
MODEL_PATH="${MODEL_PATH:-$HOME/models/Qwen2.5-0.5B-Instruct}"
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k_tool}"
N_GPUS="${N_GPUS:-1}"

"$PYTHON" -m rlx.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=64 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.model.enable_activation_offload=True \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \
    actor_rollout_ref.rollout.multi_turn.format=hermes \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOL_CONFIG" \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    trainer.device=cuda \
    trainer.logger='[console,tensorboard]' \
    trainer.project_name=rlx_gsm8k_tool \
    trainer.experiment_name=qwen2.5_0.5b_grpo_tool \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes=1 \
    trainer.val_before_train=True \
    trainer.test_freq=5 \
    trainer.save_freq=-1 \
    trainer.total_training_steps=null \
    trainer.total_epochs=1 \
    "$@"
