# Quick start: `make run` (set up .venv, run rlx/trainer/config/quickstart.yaml), `make test` (set up .venv, run the tests).
# `make test-fast`: only the tests that start no Ray and no other process (the `e2e` marker: tests/markers.py).
PY := .venv/bin/python

.PHONY: setup run test test-fast
setup:
	@scripts/setup.sh

run: setup
	$(PY) -m rlx.trainer.main_ppo --config-name quickstart $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	RLX_TEST_FAST=1 $(PY) -m pytest -m "not e2e" $(PYTEST_ARGS)
