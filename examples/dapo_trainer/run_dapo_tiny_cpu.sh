#!/usr/bin/env bash
# DAPO (Yu et al. 2025) as verl's recipe/dapo runs it, scaled down to this machine's CPU: GRPO advantages with
#   - clip-higher: clip_ratio_low=0.2, clip_ratio_high=0.28
#   - dynamic sampling: algorithm.filter_groups (metric acc; rounds of data.gen_batch_size prompts until
#     data.train_batch_size groups whose responses differ are kept; at most max_num_gen_batches rounds)
#   - token-level loss: loss_agg_mode=token-mean
#   - overlong reward shaping: reward_model.reward_manager=dapo with reward_kwargs.overlong_buffer_cfg
#   - no KL term at all (use_kl_loss=False, use_kl_in_reward=False)
# The CPU run uses the built-in tiny model and the synthetic digits task; each variable below names the value of
# verl's GPU recipe (Qwen2.5-32B on DAPO-Math-17k, validated on AIME 2024, 16 nodes x 8 GPUs) in its comment.
# DAPO-Math data (data_source math_dapo / aime*) is scored by rlx's built-in Minerva check, as in verl.
#
#   bash examples/dapo_trainer/run_dapo_tiny_cpu.sh [key=value ...]   # extra overrides are appended
#   PYTHON=/path/to/python bash examples/dapo_trainer/run_dapo_tiny_cpu.sh   # that interpreter, no setup
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)

clip_ratio_low=0.2                 # GPU: 0.2
clip_ratio_high=0.28               # GPU: 0.28
max_prompt_length=16               # GPU: 2048
max_response_length=16             # GPU: 20480
overlong_buffer_len=4              # GPU: 4096
overlong_penalty_factor=1.0        # GPU: 1.0
loss_agg_mode=token-mean           # GPU: token-mean
filter_groups_metric=acc           # GPU: acc
max_num_gen_batches=10             # GPU: 10
train_prompt_bsz=8                 # GPU: 512
gen_prompt_bsz=$((train_prompt_bsz * 3))  # GPU: 1536 (3 x 512)
n_resp_per_prompt=4                # GPU: 16
train_prompt_mini_bsz=4            # GPU: 32
lr=1e-3                            # GPU: 1e-6, with optim.lr_warmup_steps=10, optim.weight_decay=0.1
n_workers=2                        # GPU: trainer.nnodes=16 trainer.n_gpus_per_node=8
# GPU only: actor_rollout_ref.rollout.name=vllm, rollout.tensor_model_parallel_size=4,
# actor.ulysses_sequence_parallel_size=8, actor.use_dynamic_bsz=True with ppo_max_token_len_per_gpu=22528,
# actor.fsdp_config.param_offload/optimizer_offload=True, rollout temperature=1.0 top_p=1.0 top_k=-1,
# data.train_files=dapo-math-17k.parquet data.val_files=aime-2024.parquet data.truncation=left

"$PYTHON" -m rlx.trainer.main_ppo --config-name quickstart \
    data.train_files=synthetic://digits/size:2048/seed:0 \
    data.val_files=synthetic://digits/size:16/seed:1 \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.train_batch_size=${train_prompt_bsz} \
    data.gen_batch_size=${gen_prompt_bsz} \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.kl_ctrl.kl_coef=0.0 \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric=${filter_groups_metric} \
    algorithm.filter_groups.max_num_gen_batches=${max_num_gen_batches} \
    actor_rollout_ref.model.path=builtin://tiny-qwen2 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.kl_loss_coef=0.0 \
    actor_rollout_ref.actor.clip_ratio_low=${clip_ratio_low} \
    actor_rollout_ref.actor.clip_ratio_high=${clip_ratio_high} \
    actor_rollout_ref.actor.loss_agg_mode=${loss_agg_mode} \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.optim.lr=${lr} \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=${train_prompt_mini_bsz} \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.name=hf \
    actor_rollout_ref.rollout.n=${n_resp_per_prompt} \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.top_k=-1 \
    reward_model.reward_manager=dapo \
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True \
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=${overlong_buffer_len} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=${overlong_penalty_factor} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False \
    +reward_model.reward_kwargs.max_resp_len=${max_response_length} \
    trainer.device=cpu \
    trainer.logger='[console]' \
    trainer.project_name=rlx_dapo \
    trainer.experiment_name=dapo_tiny_cpu \
    trainer.n_gpus_per_node=${n_workers} \
    trainer.nnodes=1 \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    trainer.total_training_steps=4 \
    "$@"
