# make run    : set up .venv if needed, run the whole grid with Snakemake (only what is stale),
#               then write the HTML report (unless it is newer than all it shows) and print
#               where it is
# make resume : after Snakemake was killed: release its stale lock, then as `make run`
# make test   : set up .venv if needed, then lint (ruff, mypy, snakemake --lint, snakefmt) and
#               run the test suite
# make paper-smoke : config/paper.yaml end to end on CPU with a random Qwen2.5-0.5B-size
#               stand-in, a few updates per mode, then eval: time, memory and weight sync
#               per mode (a benchmark, ~10 min and ~17 GB of RAM here; not part of make test)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlcore-installed
CONFIG ?= config/config.yaml
# torch's wheel index; empty = the default (a CPU build here). GPUs: README, "GPU setup".
TORCH_INDEX ?=
REPORT ?= results/report.html
# Snakemake's jobs call `rlcore` and the scripts' python from the venv.
export PATH := $(abspath $(BIN)):$(PATH)
SNAKEMAKE := snakemake --profile workflow/profiles/default \
	--configfile $(CONFIG) --replace-workflow-config

SMOKE_MODEL ?= models/qwen2.5-0.5b-stand-in
SMOKE_OUT ?= results/paper-smoke

.PHONY: setup run resume test lint clean paper-smoke

setup: $(STAMP)

# Re-installs only when pyproject.toml changes; otherwise a no-op.
$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e '.[test,pipeline,slurm]'
	touch $(STAMP)

# The report is rebuilt only when something it shows is newer than it: the outputs beside it,
# the config, the workflow or the captions (rendering it takes seconds even when unchanged).
REPORT_INPUTS := Snakefile workflow reports $(CONFIG) $(dir $(REPORT))

run: setup
	$(SNAKEMAKE)
	@if [ -f $(REPORT) ] && [ -z "$$(find $(REPORT_INPUTS) -type f -newer $(REPORT) \
		-not -name '*.pyc' -print -quit)" ]; then \
		echo "Report up to date: nothing it shows is newer than $(REPORT)"; \
	else \
		echo "$(SNAKEMAKE) --report $(REPORT)"; \
		$(SNAKEMAKE) --report $(REPORT); \
	fi
	@echo "Report: $(abspath $(REPORT))"

resume: setup
	$(SNAKEMAKE) --unlock
	$(MAKE) run

lint: setup
	$(BIN)/ruff check rlcore tests workflow/scripts
	$(BIN)/mypy
	snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow

test: setup lint
	$(BIN)/python -m pytest -q

paper-smoke: setup
	$(BIN)/rlcore smoke config/paper.yaml --stand-in 0.5b --model $(SMOKE_MODEL) --device cpu \
		--out $(SMOKE_OUT)

clean:
	rm -rf results models
