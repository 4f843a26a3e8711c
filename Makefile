# Quick start: `make run` (set up .venv, run rlx/trainer/config/quickstart.yaml), `make test` (set up .venv, run the tests).
# `make test-fast`: tests/unit (no Ray, no other process), less the few that take seconds (the `long` marker:
# tests/markers.py), in under 3 minutes on 2 cores. `make test` runs tests/unit and tests/e2e, as CI does.
PY := .venv/bin/python

.PHONY: setup run test test-fast
setup:
	@scripts/setup.sh

run: setup
	$(PY) -m rlx.trainer.main_ppo --config-name quickstart $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	RLX_TEST_FAST=1 $(PY) -m pytest tests/unit -m "not long" $(PYTEST_ARGS)
