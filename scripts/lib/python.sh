# Sourced by the recipes of examples/ and the GPU runs of tests/gpu/: sets PYTHON, the interpreter that runs rlx.
# $PYTHON if it is set (then nothing is installed); else the project's .venv, created or updated first by
# scripts/setup.sh (a no-op when nothing changed), the interpreter `make run` uses. A bare system python3 lacks
# rlx's dependencies (omegaconf, torch, ...), so it is only the last resort. Expects ROOT (the repository) to be set.
if [[ -z "${PYTHON:-}" ]]; then
    "$ROOT/scripts/setup.sh" || exit $?  # a failed setup stops the script (its own message says why)
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
