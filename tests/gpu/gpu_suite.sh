#!/usr/bin/env bash
# The GPU suite (`pytest -m gpu tests`) one group at a time: each group fits one 9-minute run; groups that need two
# GPUs are separate (tests/gpu_groups.py holds the groups; docs/testing.md says how to run them all).
#
#   bash tests/gpu/gpu_suite.sh list           # the groups: GPUs, needs, estimated seconds, tests
#   bash tests/gpu/gpu_suite.sh K [pytest args] # run group K; its table (each test's outcome and seconds) comes last
#
# Before starting, the group's needs are checked: GPUs, and hydra / ray / vllm importable by $PYTHON (default:
# the .venv), $RLX_GSM8K_DIR holding GSM8K's train.jsonl and test.jsonl for the recipe groups. A group that could only
# skip is refused here (exit 2), naming what is missing (GPU_SUITE_PREFLIGHT=0 runs it anyway: a dry run of this
# script on a CPU, where every test skips). The run is interrupted (SIGINT: pytest still prints its
# summary and the table) after GPU_SUITE_TIMEOUT_S seconds (default 560).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/lib/python.sh"  # $PYTHON, else the .venv (scripts/setup.sh makes it)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

usage() { echo "usage: $0 list | K [pytest args...]   (K: a group of tests/gpu_groups.py)" >&2; exit 2; }
groups() { "$PYTHON" tests/gpu_groups.py "$@"; }

[ $# -ge 1 ] || usage
case "$1" in
  list) groups list; exit $? ;;
  ''|*[!0-9]*) usage ;;
esac
k="$1"; shift
files="$(groups files "$k" 2>/dev/null)" || usage
gpus="$(groups gpus "$k")"
needs="$(groups needs "$k")"

missing=()
have="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null)"
[ "${have:-0}" -ge "$gpus" ] || missing+=("$gpus GPU(s) (torch sees ${have:-none})")
for need in $needs; do
  case "$need" in
    hydra) "$PYTHON" -c 'import hydra, omegaconf' 2>/dev/null || missing+=("hydra-core and omegaconf (importable)") ;;
    ray) "$PYTHON" -c 'import ray' 2>/dev/null || missing+=("ray (importable)") ;;
    vllm) "$PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)' \
            || missing+=("vllm (importable)") ;;
    gsm8k) dir="${RLX_GSM8K_DIR:-/nonexistent}"
           [ -f "$dir/train.jsonl" ] && [ -f "$dir/test.jsonl" ] \
             || missing+=("RLX_GSM8K_DIR: a directory with GSM8K's train.jsonl and test.jsonl (is '${RLX_GSM8K_DIR:-}')") ;;
    *) missing+=("unknown need '$need' in tests/gpu_groups.py") ;;
  esac
done
if [ ${#missing[@]} -gt 0 ] && [ "${GPU_SUITE_PREFLIGHT:-1}" != 0 ]; then
  echo "gpu_suite: group $k needs:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 2
fi

"$PYTHON" - <<'EOF'
import importlib.util, os, torch
names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}) or ["no GPU"]
vllm = importlib.util.find_spec("vllm")
print(f"gpu_suite: torch {torch.__version__}, {torch.cuda.device_count()} x {', '.join(names)}; "
      f"vllm {'at ' + os.path.dirname(vllm.origin) if vllm else 'absent'}", flush=True)
EOF
# shellcheck disable=SC2086  # the group's files, one word each
timeout --signal=INT --kill-after=30 "${GPU_SUITE_TIMEOUT_S:-560}" \
  "$PYTHON" -m pytest -m gpu $files --gpu-group "$k" -q -s -p no:cacheprovider "$@"
rc=$?
[ $rc -eq 124 ] && echo "gpu_suite: group $k stopped after ${GPU_SUITE_TIMEOUT_S:-560} s" >&2
exit $rc
