# Quick start: `make run` (set up .venv, run rlx/trainer/config/quickstart.yaml), `make test` (set up .venv, run the tests).
PY := .venv/bin/python

.PHONY: setup run test
setup:
	@scripts/setup.sh

run: setup
	$(PY) -m rlx.trainer.main_ppo --config-name quickstart $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)
