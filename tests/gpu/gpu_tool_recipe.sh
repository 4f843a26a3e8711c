#!/usr/bin/env bash
# The GSM8K tool recipe on one GPU with no download: random Qwen2.5-0.5B weights -> format warm start (SFT, so that
# the model writes hermes tool calls) -> 3 GRPO steps of examples/multiturn/run_grpo_gsm8k_tool.sh (vLLM, async
# agent loop, tool_agent) -> a table of the agent metrics per step. About 5 minutes on an H100.
#
#   bash tests/gpu/gpu_tool_recipe.sh <dir with GSM8K train.jsonl/test.jsonl> [work dir] [extra trainer overrides...]
#
# Needs rlx's dependencies and vLLM importable by $PYTHON (default: .venv). SFT_STEPS / SFT_ARGS tune the warm start.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
GSM8K_DIR="${1:?usage: $0 <gsm8k jsonl dir> [work dir] [overrides...]}"
WORK="${2:-/tmp/rlx_gsm8k_tool}"
shift $(( $# >= 2 ? 2 : 1 ))
mkdir -p "$WORK"
t0=$(date +%s)
phase() { echo "=== [$(( $(date +%s) - t0 ))s] $*"; }

phase "random Qwen2.5-0.5B weights -> $WORK/random-0.5b"
"$PYTHON" -m rlx.models.random_weights qwen2.5-0.5b "$WORK/random-0.5b"

phase "GSM8K tool-agent rows -> $WORK/data"
if [ ! -f "$WORK/data/test.parquet" ]; then  # each phase is skipped when its output is already there
    "$PYTHON" "$ROOT/scripts/prepare_gsm8k.py" --multi-turn --input_dir "$GSM8K_DIR" --output_dir "$WORK/data"
fi

phase "format warm start -> $WORK/warm"
if [ ! -f "$WORK/warm/config.json" ]; then
    # shellcheck disable=SC2086
    "$PYTHON" "$ROOT/scripts/sft_tool_format.py" --model "$WORK/random-0.5b" --data "$WORK/data/train.parquet" \
        --eval_data "$WORK/data/test.parquet" --output_dir "$WORK/warm" --steps "${SFT_STEPS:-300}" ${SFT_ARGS:-} \
        2>&1 | tee "$WORK/sft.log"
fi

phase "GRPO, 3 steps (examples/multiturn/run_grpo_gsm8k_tool.sh)"
rm -rf "$WORK/ckpt"
# prompts with the tool schemas reach ~1.75k byte tokens (the byte tokenizer of random-weight models)
MODEL_PATH="$WORK/warm" DATA_DIR="$WORK/data" PYTHON="$PYTHON" bash "$ROOT/examples/multiturn/run_grpo_gsm8k_tool.sh" \
    data.train_batch_size=16 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    data.max_prompt_length=2048 \
    data.max_response_length=512 \
    trainer.total_training_steps=3 \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    'trainer.logger=[console,file]' \
    trainer.default_local_dir="$WORK/ckpt" \
    "$@" 2>&1 | tee "$WORK/grpo.log"

phase "done"
grep '^\[sft\]' "$WORK/sft.log" || true
"$PYTHON" - "$WORK/ckpt" <<'EOF'
import glob, json, sys

paths = glob.glob(f"{sys.argv[1]}/**/metrics.jsonl", recursive=True)
if not paths:
    sys.exit(f"no metrics.jsonl under {sys.argv[1]}")
cols = [("turns", "agent/num_turns/mean"), ("turns max", "agent/num_turns/max"),
        ("tool calls", "agent/tool_calls/mean"), ("tool errors", "agent/tool_errors/mean"),
        ("asst tok", "agent/assistant_tokens/mean"), ("tool tok", "agent/tool_tokens/mean"),
        ("tool wait s", "agent/tool_wait_s/mean"), ("wait max s", "agent/tool_wait_s/max"),
        ("score", "critic/score/mean"), ("resp len", "response_length/mean"), ("gen s", "timing_s/gen"),
        ("step s", "timing_s/step"), ("peak GiB", "perf/max_memory_allocated_gb")]
print("| step | " + " | ".join(c for c, _ in cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for line in open(paths[0]):
    m = json.loads(line)
    cells = [f"{m[k]:.3g}" if isinstance(m.get(k), (int, float)) else "-" for _, k in cols]
    print(f"| {m.get('step')} | " + " | ".join(cells) + " |")
EOF
