# make run    : set up .venv if needed, run the whole grid with Snakemake (only what is stale),
#               then write the HTML report (unless it is newer than all it shows) and print
#               where it is
# make resume : after Snakemake was killed: release its stale lock, then as `make run`
# make test   : set up .venv if needed, then lint (ruff, mypy, snakemake --lint, snakefmt) and
#               run the test suite
# make check  : while developing: the same lint as make test, then the tests not marked slow
#               (`-m "not slow"`), on CHECK_WORKERS (2) pytest workers; make test (what CI runs)
#               is lint and every test
# make profile : the default grid's first sync run and an emulated AReaL-style run under
#               cProfile, cold, 3 times interleaved: start-up, decode step, update
#               (tools/profile_run.py; needs the base model `make run` builds; ~3 min)
# make hooks  : for this clone only, refuse commits whose subject is over 72 characters
#               (.githooks/commit-msg; `make lint` checks the subjects of new commits too)
# make lock   : refresh requirements.lock, the exact versions `make setup` installs: resolve
#               pyproject.toml's ranges anew in a throwaway venv (torch==TORCH_VERSION first,
#               then the package with all extras) and freeze it; commit the result (~2 min)
# make check-virtual : rerun only the default grid's virtual-clock runs and their replays (in a
#               temporary directory, ~8 min here) and check their records, weights and evals
#               against tests/golden/virtual_grid.json: for changes that must not change results
# make paper-smoke : config/paper.yaml end to end on CPU with a random Qwen2.5-0.5B-size
#               stand-in, a few updates per mode, then eval: time, memory and weight sync
#               per mode (a benchmark, ~7 min and ~16 GiB of RAM here; not part of make test)
# make gpu-check : on a machine with a CUDA GPU, tools/gpu_check.py's seven stages in one go:
#               CUDA's rules and `pytest -m cuda`, the transport and decode probes, LoRA
#               under fp16 (run, eval, replay), the paper's smoke, a calibrated profile of
#               the card, live against virtual runs on it, the gpu-smoke pipeline (each
#               stage under 7 min at the step limits, a few times an H200's timings; on a
#               slower card raise a step's with --limit STEP=S: docs/setup.md, "Checking a
#               GPU"; results in GPU_OUT)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlcore-installed
CONFIG ?= config/config.yaml
# torch's wheel index; empty = the default (a CPU build here). GPUs: docs/setup.md, "GPU setup"
# (into a new .venv only: an existing one keeps its torch, whose build meets the lock).
TORCH_INDEX ?=
# Exact versions of everything `make setup` installs (torch without its build tag, e.g. +cpu).
LOCK := requirements.lock
# The torch release `make lock` starts from; `make setup` takes the one in the lock.
TORCH_VERSION ?= 2.13.0
# The report goes beside the results: the `results:` of the last config file that sets it
# (an overlay such as config/resolve.yaml has its own), else results/.
RESULTS := $(or $(lastword $(foreach f,$(CONFIG),$(shell sed -n 's/^results: *\([^ #]*\).*/\1/p' $(f)))),results)
REPORT ?= $(RESULTS)/report.html
# Snakemake's jobs call `rlcore` and the scripts' python from the venv.
export PATH := $(abspath $(BIN)):$(PATH)
SNAKEMAKE := snakemake --profile workflow/profiles/default \
	--configfile $(CONFIG) --replace-workflow-config

# make test (what CI runs) and make check (its fast tier) run on two pytest-xdist workers, each
# test file on one of them (so a file's session fixtures are built once per worker). N = 0:
# one process.
CHECK_WORKERS ?= 2
TEST_WORKERS ?= 2
workers = $(if $(filter 0,$(1)),,-n $(1) --dist loadfile)

SMOKE_MODEL ?= models/qwen2.5-0.5b-stand-in
SMOKE_OUT ?= results/paper-smoke
GPU_OUT ?= results/gpu-check
PROFILE_OUT ?= results/profile

.PHONY: setup hooks lock run resume test check lint clean paper-smoke check-virtual gpu-check \
	profile

setup: $(STAMP)

# Re-installs only when pyproject.toml or the lock changes; otherwise a no-op. pip and torch
# come first, at the lock's versions (torch from TORCH_INDEX when set: the lock's `torch==X`
# is met by any build of X, +cpu or +cuXYZ); then everything in the lock; then the package
# itself, which adds nothing; pip check fails if the lock no longer meets pyproject's ranges.
$(STAMP): pyproject.toml $(LOCK)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$$(grep '^pip==' $(LOCK))"
	$(BIN)/python -m pip install -q --no-deps "$$(grep '^torch==' $(LOCK))" \
		$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -r $(LOCK)
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m pip check
	touch $(STAMP)

# A fresh venv in a temporary folder, removed afterwards; the lock is replaced only on success.
lock:
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; py="$$tmp/venv/bin/python"; \
	$$py -m pip install -q --upgrade pip; \
	$$py -m pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	$$py -m pip install -q -e '.[test,pipeline,slurm,real]'; \
	{ echo "# Exact versions for \`make setup\`; regenerate with \`make lock\` (see the Makefile), never by hand."; \
	  echo "# Resolved from pyproject.toml's ranges with all extras, after torch==$(TORCH_VERSION)$(if $(TORCH_INDEX), from $(TORCH_INDEX)),"; \
	  echo "# by pip freeze --all --exclude-editable; torch's build tag (+cpu, +cuXYZ) dropped."; \
	  echo "# Python $$($$py -c 'import platform; print(platform.python_version(), platform.system(), platform.machine())')"; \
	  $$py -m pip freeze --all --exclude-editable | sed -E 's/^(torch==[^+]*)\+.*/\1/'; \
	} > "$$tmp/lock"; \
	mv "$$tmp/lock" $(LOCK)

# The report is rebuilt only when something it shows is newer than it: the outputs beside it,
# the config, the workflow or the captions (rendering it takes seconds even when unchanged).
REPORT_INPUTS := Snakefile workflow reports $(CONFIG) $(dir $(REPORT))

# The jobs' warm launcher server (docs/launcher.md) is stopped when Snakemake ends, whatever
# its status; an idle one would exit on its own after 5 minutes.
run: setup
	$(SNAKEMAKE); status=$$?; $(BIN)/python -m rlcore.launcher --stop; exit $$status
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

hooks:
	git config --local core.hooksPath .githooks

lint: setup
	$(BIN)/python tools/commit_msg.py
	$(BIN)/ruff check rlcore tests tools workflow/scripts
	$(BIN)/mypy
	snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow

test: setup lint
	$(BIN)/python -m pytest -q $(call workers,$(TEST_WORKERS))

check: setup lint
	$(BIN)/python -m pytest -q -m "not slow" $(call workers,$(CHECK_WORKERS))

check-virtual: setup
	$(BIN)/python -m tests.virtual_grid check; status=$$?; $(BIN)/python -m rlcore.launcher --stop; \
		exit $$status

paper-smoke: setup
	$(BIN)/rlcore smoke config/paper.yaml --stand-in 0.5b --model $(SMOKE_MODEL) --device cpu \
		--out $(SMOKE_OUT)

profile: setup
	$(BIN)/python tools/profile_run.py --config $(CONFIG) --out $(PROFILE_OUT)

gpu-check: setup
	$(BIN)/python tools/gpu_check.py --out $(GPU_OUT) --work $(GPU_OUT)/work

clean:
	rm -rf results models
