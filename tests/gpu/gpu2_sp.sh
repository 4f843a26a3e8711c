#!/usr/bin/env bash
# Ulysses sequence parallelism through the entry point on two GPUs, with long responses:
#
#   bash tests/gpu/gpu2_sp.sh          # ~5-8 min on 2 H100s (each 32k-token generation ~0.5-1.5 min); the table last
#
# 1. The bf16 check on the engines (tests/e2e/test_ulysses.py, both GPUs over NCCL): the actor's log-probs of one batch
#    under SP=2 are as close to the fp32 values as SP=1's (bf16 noise). (The fp32 exactness test, SP=2 = SP=1
#    within 1e-5 for log-probs, values, losses and every gradient, runs in the GPU suite's group 6.)
# 2. A GRPO job, `python -m rlx.trainer.main_ppo`: actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 (one
#    sequence-parallel group over the 2 GPUs), responses of RESPONSE tokens (default 32768; rollout.ignore_eos, so
#    every response is that long, and rollout.max_model_len = prompt + response), activation offload + gradient
#    checkpointing + tiled decoder layers (model.tile_layer_tokens=8192), remove padding, dynamic batch size, vLLM
#    with CUDA graphs, one engine per GPU. STEPS steps (default 2) of 2 prompts x n=2. The model: the built-in tiny
#    Qwen2 (4 heads, 2 KV heads: SP=2 divides both) with max_position_embeddings raised to hold the responses, so
#    that generating 32k tokens takes under a minute. (rlx validates after the last step whatever trainer.test_freq
#    says: on 2 prompts here.) Then its per-step phase table (python -m rlx.trainer.phases),
#    with the response length, the tokens of the update and the memory.
#
# Needs rlx's dependencies, vLLM and pytest importable by $PYTHON (default: .venv). WORK=<dir> keeps the outputs.
# DEVICE=cpu RESPONSE=256 STEPS=1 runs the job on the CPU (2 worker processes, gloo) as a dry run of this script.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
RESPONSE="${RESPONSE:-32768}"
PROMPT=16
STEPS="${STEPS:-2}"
DEVICE="${DEVICE:-cuda}"
EAGER=False  # CUDA graphs: a 32k-token decode is thousands of tiny steps
[ "$DEVICE" = cuda ] || EAGER=True
WORK="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/rlx-gpu2-sp.XXXXXX")}"
mkdir -p "$WORK"
t0=$SECONDS

echo "=== 1. SP=2 vs SP=1 on the engines, 2 GPUs (tests/e2e/test_ulysses.py)"
timeout --signal=INT --kill-after=30 150 "$PYTHON" -m pytest -q -s -p no:cacheprovider -m gpu tests/e2e/test_ulysses.py \
  -k sp2_logprobs_match_sp1_at_bf16_noise_on_two_gpus 2>&1 \
  | grep -E "log-probs vs fp32|passed|failed|skipped|Error|error" | tail -n 20
check_rc=${PIPESTATUS[0]}
echo "    exit $check_rc after $((SECONDS - t0)) s"

echo "=== 2. GRPO with SP=2, $RESPONSE-token responses ($WORK/job.log)"
MODEL="$WORK/tiny-long"
"$PYTHON" - "$MODEL" $((PROMPT + RESPONSE)) <<'EOF'
import json, os, shutil, sys
from rlx.models import resolve_model_path
src, dst, length = resolve_model_path("builtin://tiny-qwen2"), sys.argv[1], int(sys.argv[2])
shutil.copytree(src, dst, dirs_exist_ok=True)
path = os.path.join(dst, "config.json")
cfg = json.load(open(path))
cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], length)
json.dump(cfg, open(path, "w"), indent=1)
print(f"    model {dst}: the built-in tiny Qwen2, max_position_embeddings {cfg['max_position_embeddings']}")
EOF
A=actor_rollout_ref
t1=$SECONDS
timeout --signal=INT --kill-after=30 "${JOB_TIMEOUT_S:-420}" \
  "$PYTHON" -m rlx.trainer.main_ppo --config-name quickstart \
  "trainer.device=$DEVICE" trainer.n_gpus_per_node=2 trainer.nnodes=1 "trainer.total_training_steps=$STEPS" \
  trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 "trainer.logger=[console,file]" \
  "trainer.default_local_dir=$WORK/job" \
  "data.max_prompt_length=$PROMPT" "data.max_response_length=$RESPONSE" data.train_batch_size=2 \
  data.val_files=synthetic://digits/size:2/seed:1 \
  "$A.model.path=$MODEL" "$A.model.use_remove_padding=True" \
  "$A.model.enable_gradient_checkpointing=True" "$A.model.enable_activation_offload=True" \
  "$A.model.tile_layer_tokens=8192" \
  "$A.actor.strategy=fsdp2" "$A.actor.ulysses_sequence_parallel_size=2" \
  "$A.actor.ppo_mini_batch_size=2" "$A.actor.use_dynamic_bsz=True" \
  "$A.actor.ppo_max_token_len_per_gpu=$((PROMPT + RESPONSE))" \
  "$A.rollout.log_prob_use_dynamic_bsz=True" "$A.rollout.log_prob_max_token_len_per_gpu=$((PROMPT + RESPONSE))" \
  "$A.rollout.name=vllm" "$A.rollout.n=2" "$A.rollout.tensor_model_parallel_size=1" "$A.rollout.ignore_eos=True" \
  "$A.rollout.max_model_len=$((PROMPT + RESPONSE))" "$A.rollout.enforce_eager=$EAGER" \
  > "$WORK/job.log" 2>&1
job_rc=$?
grep -E "^rlx: " "$WORK/job.log" | sed "s/^/    /"
[ $job_rc -eq 0 ] || tail -n 30 "$WORK/job.log" | sed "s/^/    | /"
echo "    exit $job_rc after $((SECONDS - t1)) s"

echo
echo "### GRPO ($DEVICE), Ulysses SP=2 over 2 ranks, $RESPONSE-token responses (ignore_eos), 2 prompts x n=2 a step"
"$PYTHON" - "$WORK/job/logs/metrics.jsonl" <<'EOF'
import os, sys
from rlx.trainer.phases import read, render
path = sys.argv[1]
records = read(path) if os.path.exists(path) else []
print(render(records))
keys = ("response_length/mean", "perf/total_num_tokens", "perf/max_memory_allocated_gb",
        "perf/update_actor/offloaded_activation_gb", "actor/grad_norm")
for r in records:
    print(f"step {r.get('step', '?')}: " + ", ".join(f"{k} {r[k]:.4g}" for k in keys if k in r))
EOF
echo "sp checks exit $check_rc, job exit $job_rc; $((SECONDS - t0)) s in all"
[ $check_rc -eq 0 ] && [ $job_rc -eq 0 ]
