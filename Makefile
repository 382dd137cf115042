# make run  : set up .venv if needed, build the tiny base model, train it with the sync runner
# make test : set up .venv if needed, then lint and run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlcore-installed
CONFIG ?= config/config.yaml
RUN_DIR ?= results/runs/sync/k0/pg/seed0

.PHONY: setup run test lint clean

setup: $(STAMP)

# Re-installs only when pyproject.toml changes; otherwise a no-op.
$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,pipeline]'
	touch $(STAMP)

run: setup
	$(BIN)/rlcore build-base models/tiny --config $(CONFIG)
	$(BIN)/rlcore run $(CONFIG) --out $(RUN_DIR) --force
	$(BIN)/rlcore eval $(RUN_DIR) --policy base
	$(BIN)/rlcore eval $(RUN_DIR)

lint: setup
	$(BIN)/ruff check rlcore tests workflow/scripts

test: setup lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf results models
