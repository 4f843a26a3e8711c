# Quick start: `make run` (set up .venv, run rlx/trainer/config/quickstart.yaml), `make test` (set up .venv, run the tests).
# `make test-fast`: the CPU tests that start no Ray and no other process and take about a second at most
# (the `e2e` and `long` markers: tests/markers.py), in under 3 minutes on 2 cores.
PY := .venv/bin/python

.PHONY: setup run test test-fast
setup:
	@scripts/setup.sh

run: setup
	$(PY) -m rlx.trainer.main_ppo --config-name quickstart $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	RLX_TEST_FAST=1 $(PY) -m pytest -m "not e2e and not long and not gpu" $(PYTEST_ARGS)
