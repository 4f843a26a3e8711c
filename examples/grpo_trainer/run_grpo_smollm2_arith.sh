#!/usr/bin/env bash
# GRPO on rlx's arithmetic task (synthetic://arith: sums of 2-3 digit numbers, products of a 2-digit and a 1-digit
# number, answer after "####") with SmolLM2-135M-Instruct, vLLM rollout, one GPU. No data files: the training
# problems (seed 0) and the 500 held-out ones (seed 1000) are generated. Everything else, LORA=1 and OFFLOAD=1
# included, is the GSM8K recipe's (examples/grpo_trainer/run_grpo_smollm2_gsm8k.sh).
#
#   bash examples/grpo_trainer/run_grpo_smollm2_arith.sh [key=value ...]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export TRAIN_FILES="synthetic://arith/size:20000/seed:0"
export VAL_FILES="synthetic://arith/size:500/seed:1000/split:test"
export RUN_DIR="${RUN_DIR:-checkpoints/smollm2_grpo_arith}"
exec bash "$HERE/run_grpo_smollm2_gsm8k.sh" data.max_prompt_length=128 trainer.experiment_name=grpo_arith "$@"
