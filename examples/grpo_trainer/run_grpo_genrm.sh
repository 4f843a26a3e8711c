#!/usr/bin/env bash
# GRPO on GSM8K scored by a generative reward model (an LLM judge) instead of the rule, on one GPU.
#
# The judge (JUDGE_PATH, an instruct model; default $HOME/models/Qwen2.5-1.5B-Instruct) reads each question, the
# policy's answer and GSM8K's reference answer through rlx's built-in template (docs/reward_model.md, "Generative
# reward model"), writes a short verdict ending in "Score: N" (0-10), greedily, with its own vLLM engine in the
# reward-model worker; the parsed N is the reward. Both vLLM engines (policy, judge) sleep when not generating.
#
# Data: $HOME/data/gsm8k/{train,test}.parquet in verl's row format, made (offline) by
#   .venv/bin/python scripts/prepare_gsm8k.py --input_dir <dir with train.jsonl/test.jsonl> --output_dir ~/data/gsm8k
#
#   MODEL_PATH=/path/to/Qwen2.5-0.5B-Instruct JUDGE_PATH=/path/to/Qwen2.5-1.5B-Instruct \
#       bash examples/grpo_trainer/run_grpo_genrm.sh
#
# Watch reward/judge_parse_failures (verdicts without a usable score, scored reward_model.judge.failure_score) and
# reward/judge_verdicts_clipped (verdicts cut at reward_model.rollout.response_length). Extra key=value arguments
# are appended (a later key wins), e.g. reward_model.judge.prompt_template='...{question}...{response}...'.
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
MODEL_PATH="${MODEL_PATH:-$HOME/models/Qwen2.5-0.5B-Instruct}"
JUDGE_PATH="${JUDGE_PATH:-$HOME/models/Qwen2.5-1.5B-Instruct}"
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k}"
N_GPUS="${N_GPUS:-1}"

"$PYTHON" -m rlx.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=64 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.35 \
    actor_rollout_ref.rollout.n=5 \
    reward_model.enable=True \
    reward_model.model.path="$JUDGE_PATH" \
    reward_model.judge.enable=True \
    reward_model.judge.failure_score=0 \
    reward_model.rollout.name=vllm \
    reward_model.rollout.dtype=bfloat16 \
    reward_model.rollout.tensor_model_parallel_size=1 \
    reward_model.rollout.gpu_memory_utilization=0.3 \
    reward_model.rollout.prompt_length=1536 \
    reward_model.rollout.response_length=512 \
    reward_model.rollout.free_cache_engine=True \
    algorithm.use_kl_in_reward=False \
    trainer.device=cuda \
    trainer.logger='[console,tensorboard]' \
    trainer.project_name=rlx_grpo_gsm8k_genrm \
    trainer.experiment_name=qwen2.5_0.5b_judged_by_1.5b \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes=1 \
    trainer.val_before_train=True \
    trainer.save_freq=-1 \
    trainer.test_freq=10 \
    trainer.total_training_steps=null \
    trainer.total_epochs=1 \
    "$@"
