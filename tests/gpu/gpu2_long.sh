#!/usr/bin/env bash
# Long responses on two GPUs: one RL update (benchmarks/bench_rl_update.py: rlx's actor engine, no Ray; FSDP2 over the
# 2 GPUs with bf16 compute, fp32 master weights and fp32 AdamW; one Ulysses group, SP=2; batch 1, prompt 512;
# activation offload + checkpointing + fused log-prob head + tiled decoder layers), each mode one 10-minute run with
# the bench's table last:
#
#   bash tests/gpu/gpu2_long.sh 7b        # Qwen2.5-7B dims, full fine-tune, 262,144-token response, the AdamW state
#                                       # on the CPU until the optimizer step (optoff); ~5 min, of which ~2 min write
#                                       # the random 7B weights on a fresh machine (kept in the temp dir); also writes
#                                       # the 1.5B weights for `1m`
#   bash tests/gpu/gpu2_long.sh 7b-plain  # the same with the AdamW state on the GPU: 14 GiB params + 14 grads + 28
#                                       # state per GPU, ~20 activations: expected not to fit in 80 GiB (OOM row)
#   bash tests/gpu/gpu2_long.sh 1m        # Qwen2.5-1.5B dims, 1,048,576-token response; ~9.5 min: attention is
#                                       # quadratic (262k took 31.9 s per update at SP=2; 1M ~16x that)
#   bash tests/gpu/gpu2_long.sh 768k      # the same at 786,432 tokens (~5.5 min), if 1m runs past its limit
#
# Needs torch with 2 GPUs and rlx's dependencies (hydra, omegaconf) importable by $PYTHON (default: .venv).
# WORK=<dir> keeps the JSON results (default: a new temporary folder).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
WORK="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/rlx-gpu2-long.XXXXXX")}"
mkdir -p "$WORK"
SCHEME=offload_ckpt_fused_layer
BENCH=("$PYTHON" benchmarks/bench_rl_update.py --cap-gib 80 --search-tries 0 --warmup 8192)

write_1_5b() {  # the 1.5B weights of `1m`, written now so that its run has all its time for the update
  "$PYTHON" - <<'EOF'
import argparse, sys, time
sys.path.insert(0, "benchmarks")
from bench_rl_update import model_dir
t = time.perf_counter()
path = model_dir(argparse.Namespace(shape="1.5b", model_dir=""))
print(f"1.5B dims, random weights: {path} ({time.perf_counter() - t:.0f} s)", flush=True)
EOF
}

case "${1:-}" in
  7b)
    write_1_5b
    "${BENCH[@]}" --preset 7b --schemes "${SCHEME}_optoff_sp2" --lengths 262144 --json "$WORK/7b.json" ;;
  7b-plain)
    "${BENCH[@]}" --preset 7b --schemes "${SCHEME}_sp2" --lengths 262144 --json "$WORK/7b_plain.json" ;;
  1m)
    "${BENCH[@]}" --shape 1.5b --schemes "${SCHEME}_sp2" --lengths 1048576 --run-timeout 575 \
      --json "$WORK/1m.json" ;;
  768k)
    "${BENCH[@]}" --shape 1.5b --schemes "${SCHEME}_sp2" --lengths 786432 --json "$WORK/768k.json" ;;
  *) echo "usage: $0 7b | 7b-plain | 1m | 768k" >&2; exit 2 ;;
esac
