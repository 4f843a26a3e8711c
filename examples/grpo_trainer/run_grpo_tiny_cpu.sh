#!/usr/bin/env bash
# GRPO on this machine, CPU only, nothing downloaded: the built-in tiny Qwen2-style model (materialised from
# rlx/models/configs/tiny-qwen2.json), the synthetic `digits` task with its rule reward, and 2 Ray workers
# over gloo, starting from the quickstart config (rlx/trainer/config/quickstart.yaml). Takes a few minutes on 2
# cores; prints per-step metrics and the validation reward at start and end.
#
#   bash examples/grpo_trainer/run_grpo_tiny_cpu.sh                      # sets up .venv first (scripts/setup.sh)
#   bash examples/grpo_trainer/run_grpo_tiny_cpu.sh trainer.total_training_steps=2   # extra key=value arguments
#   PYTHON=/some/python bash examples/grpo_trainer/run_grpo_tiny_cpu.sh  # use that interpreter, skip the setup
set -xeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)

"$PYTHON" -m rlx.trainer.main_ppo --config-name quickstart \
    algorithm.adv_estimator=grpo \
    data.train_files=synthetic://digits/size:2048/seed:0 \
    data.val_files=synthetic://digits/size:64/seed:1 \
    data.train_batch_size=16 \
    data.max_prompt_length=16 \
    data.max_response_length=16 \
    actor_rollout_ref.model.path=builtin://tiny-qwen2 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=hf \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    algorithm.use_kl_in_reward=False \
    trainer.device=cpu \
    trainer.logger='[console]' \
    trainer.project_name=rlx_tiny \
    trainer.experiment_name=grpo_tiny_cpu \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.val_before_train=True \
    trainer.save_freq=-1 \
    trainer.test_freq=-1 \
    trainer.total_training_steps=6 \
    "$@"
