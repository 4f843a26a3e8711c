# Quick start: `make run` (set up .venv, run the default job), `make test` (set up .venv, run the test suite).
PY := .venv/bin/python

.PHONY: setup run test
setup:
	@scripts/setup.sh

run: setup
	$(PY) -m rlx.trainer.main_ppo $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)
