# Everything a fresh machine needs: `make run` (the main job) and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# `make test` splits the suite over this many pytest-xdist workers (tests/parallel_units.py: how; 0: one process).
PYTEST_WORKERS ?= 3
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder)
# Extra `verl-grpo run` arguments for `make run`, e.g. RUN_ARGS="-o model.name=tiny" (the one-minute tiny run that
# tests/e2e/conftest.py::first_cli_run makes of this very recipe).
RUN_ARGS ?=
# The optional extras `make install` adds to the core (pyproject.toml): all of them, for `make test` and the cloud;
# `make run EXTRAS=` installs the core alone, all the local flow needs.
EXTRAS ?= cloud,search,ray,wandb,rehearsal,test
# One stamp per set of extras: `make test` after `make run EXTRAS=` installs what the core alone lacks.
comma := ,
STAMP := $(VENV)/.installed$(if $(EXTRAS),-$(subst $(comma),-,$(EXTRAS)))

# Python writes the bytecode of each module it imports, once (into .venv and this checkout's __pycache__, which git
# ignores): on a machine that sets PYTHONDONTWRITEBYTECODE, as this one does, every process of a run or a test run
# (some thousand) would compile every module it imports again. Only what is imported gets compiled: the install
# compiles nothing, since compiling every file of the venv up front costs far more than the modules a run imports.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install run lint browser test test-fast bench lock clean serve stop

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv==0.13.9
	# The CPU build of torch lies on local disk (pip's find-links); installing it first keeps the CUDA build out.
	$(PY) -m pip install -q --no-compile torch==2.13.0
	# uv installs the locked set several times faster than pip (the same versions: the lock pins every package, torch
	# included, which uv finds installed); pip is the fallback should uv fail on a machine.
	$(VENV)/bin/uv pip install --python $(PY) -q -c requirements.lock -e '.$(if $(EXTRAS),[$(EXTRAS)])' || \
	  { echo "uv failed; installing with pip"; $(PY) -m pip install -q --no-compile -c requirements.lock -e '.$(if $(EXTRAS),[$(EXTRAS)])'; }
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/verl-grpo run -c reasoning_gym -c local $(RUN_ARGS)

# The lint gate (ruff: pyflakes, sorted imports, 120-column product code; [tool.ruff] in pyproject.toml) runs before
# either suite; `ruff check --fix .` mends what it can.
lint: install
	$(VENV)/bin/ruff check .

# The browser test (tests/browser.py: `make serve`'s UIs rendered as a person sees them) drives Debian's headless
# Chromium, installed here when missing (needs root or sudo, as apt-get does).
browser:
	@command -v chromium >/dev/null || { echo "installing Debian's chromium for the browser test"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -qq && \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq chromium >/dev/null; }

test: lint browser
	$(VENV)/bin/pytest -q $(XDIST) --durations=15 $(PYTEST_ARGS)

test-fast: lint
	$(VENV)/bin/pytest -q $(XDIST) tests/unit $(PYTEST_ARGS)

bench: install
	mkdir -p bench/results
	set -e; for b in bench/*_bench.py; do echo "== $$b"; $(PY) $$b; done

# Local Prefect server (127.0.0.1:$(PREFECT_SERVER_PORT), SQLite in .state/prefect), the MLflow UI of the local
# tracking store (127.0.0.1:$(MLFLOW_UI_PORT)), the verl-grpo deployments and a process worker, in the
# background; PIDs and logs in .state/prefect. Fails when a server service logs errors. `make stop` stops them.
PREFECT_SERVER_PORT ?= 4200
MLFLOW_UI_PORT ?= 5000
serve: install
	PREFECT_SERVER_PORT=$(PREFECT_SERVER_PORT) MLFLOW_UI_PORT=$(MLFLOW_UI_PORT) VENV=$(abspath $(VENV)) infra/prefect/serve.sh

stop:
	infra/prefect/stop.sh

# Re-resolve the pinned lock (uv resolves in seconds where pip backtracks for many minutes).
lock: install
	$(VENV)/bin/pip install -q uv==0.13.9
	$(VENV)/bin/uv pip compile pyproject.toml --all-extras -o requirements.lock --python-version 3.11

clean:
	rm -rf .state/work .state/prefect
