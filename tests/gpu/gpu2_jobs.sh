#!/usr/bin/env bash
# Jobs on two GPUs through the entry point (`python -m rlx.trainer.main_ppo`), each printing its table last.
#
#   bash tests/gpu/gpu2_jobs.sh rl        # (a) (b) (c), ~5 min on 2 H100s; one table: val reward first -> last, step s
#   bash tests/gpu/gpu2_jobs.sh scaling   # (d) benchmarks/bench_job.py on 1 then 2 GPUs, same batch per GPU, ~5 min
#
# (a) GRPO, FSDP2 over 2 ranks, activation offload + checkpointing, param/optimizer offload, remove padding,
#     dynamic batch size, vLLM with one engine per GPU (rollout TP 1);
# (b) the same with one vLLM engine over both GPUs (rollout.tensor_model_parallel_size=2);
# (c) PPO with a critic (GAE), the critic on FSDP2 with the same offload and batch shaping, vLLM TP 1.
# The model learns in a minute or two: the quickstart job (rlx/trainer/config/quickstart.yaml: the built-in tiny
# Qwen2 on the synthetic digits task, validation reward ~0.01 at the start), validated every 10 steps.
# (d) the GRPO job of benchmarks/bench_job.py (Qwen2.5-0.5B dims, random weights, 64 prompts x 5 per GPU, 1024-token
#     responses, vLLM): its phase table per GPU count and the 2-GPU / 1-GPU tokens-per-second ratio.
#
# Needs rlx's dependencies and vLLM importable by $PYTHON (default: .venv). DEVICE=cpu STEPS=2 runs (a) and (c)
# on the CPU (2 worker processes, gloo) as a dry run of this script; WORK=<dir> keeps the outputs (default: a new
# temporary folder). Exits non-zero when a job failed (after the table), as `scaling` does when its benchmark fails.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
DEVICE="${DEVICE:-cuda}"
STEPS="${STEPS:-}"
WORK="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/rlx-gpu2-jobs.XXXXXX")}"
mkdir -p "$WORK"

A=actor_rollout_ref
COMMON=(--config-name quickstart "trainer.device=$DEVICE" trainer.n_gpus_per_node=2 trainer.nnodes=1
        "$A.rollout.name=vllm" "$A.actor.strategy=fsdp2" "trainer.logger=[console,file]" trainer.save_freq=-1
        trainer.val_before_train=True trainer.test_freq=10)
# offload (activations with checkpointing, params and optimizer state between phases), remove padding, dynamic
# batch size: a tiny model's activations are small, so offload all of them (min_tensor_bytes=0, keep_last_layers=0)
ACTOR_SHAPING=("$A.model.enable_gradient_checkpointing=True" "$A.model.enable_activation_offload=True"
               "$A.model.activation_offload.min_tensor_bytes=0" "$A.model.activation_offload.keep_last_layers=0"
               "$A.model.use_remove_padding=True" "$A.actor.use_dynamic_bsz=True"
               "$A.actor.ppo_max_token_len_per_gpu=256"
               "$A.rollout.log_prob_use_dynamic_bsz=True" "$A.rollout.log_prob_max_token_len_per_gpu=512"
               "$A.actor.fsdp_config.param_offload=True" "$A.actor.fsdp_config.optimizer_offload=True")
CRITIC_SHAPING=(algorithm.adv_estimator=gae critic.strategy=fsdp2 critic.model.enable_gradient_checkpointing=True
                critic.model.enable_activation_offload=True critic.model.activation_offload.min_tensor_bytes=0
                critic.model.activation_offload.keep_last_layers=0 critic.model.use_remove_padding=True
                critic.use_dynamic_bsz=True critic.ppo_max_token_len_per_gpu=256
                critic.forward_max_token_len_per_gpu=512 critic.model.fsdp_config.param_offload=True
                critic.model.fsdp_config.optimizer_offload=True)

TABLE=()
FAILED=()
job() {  # job NAME STEPS OVERRIDES...: run it, keep its log, note its exit code for the table
  local name="$1" steps="${STEPS:-$2}"; shift 2
  local t0=$SECONDS
  echo "=== $name: $steps steps ($WORK/$name.log)"
  timeout --signal=INT --kill-after=30 "${JOB_TIMEOUT_S:-280}" "$PYTHON" -m rlx.trainer.main_ppo "${COMMON[@]}" \
    "trainer.total_training_steps=$steps" "trainer.default_local_dir=$WORK/$name" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  grep -E "^validation |^rlx: " "$WORK/$name.log" | sed "s/^/    /"
  [ $rc -eq 0 ] || tail -n 25 "$WORK/$name.log" | sed "s/^/    | /"
  echo "    exit $rc after $((SECONDS - t0)) s"
  TABLE+=("$name=$WORK/$name:$rc")
  [ $rc -eq 0 ] || FAILED+=("$name (exit $rc)")
}

rl() {
  job a_grpo_fsdp2_2gpu_vllm_tp1 20 "${ACTOR_SHAPING[@]}" "$A.rollout.tensor_model_parallel_size=1"
  if [ "$DEVICE" = cuda ]; then  # TP > 1 needs GPUs
    job b_grpo_fsdp2_2gpu_vllm_tp2 20 "${ACTOR_SHAPING[@]}" "$A.rollout.tensor_model_parallel_size=2"
  fi
  job c_ppo_critic_2gpu_vllm_tp1 30 "${ACTOR_SHAPING[@]}" "${CRITIC_SHAPING[@]}" \
    "$A.rollout.tensor_model_parallel_size=1"
  echo
  echo "### two-GPU jobs ($DEVICE): the quickstart job (tiny Qwen2, synthetic digits), GRPO n=4 unless named"
  "$PYTHON" scripts/jobs_table.py "${TABLE[@]}"
  if [ ${#FAILED[@]} -gt 0 ]; then  # the table shows every job; the exit status says whether all of them ran
    echo "gpu2_jobs: ${#FAILED[@]} job(s) failed: ${FAILED[*]} (logs in $WORK)" >&2
    return 1
  fi
}

scaling() {
  local extra=()
  [ "$DEVICE" = cpu ] && extra=(--smoke)
  "$PYTHON" benchmarks/bench_job.py --rollouts vllm --gpus 1,2 --vllm-steps "${STEPS:-2}" --out "$WORK/scaling" \
    "${extra[@]}"
}

case "${1:-}" in
  rl) rl ;;
  scaling) scaling ;;
  *) echo "usage: $0 rl | scaling   (DEVICE=cpu STEPS=2 for a CPU dry run)" >&2; exit 2 ;;
esac
