# klppo-recipes: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python
# pytest-xdist workers for test and test-fast: the training runs go in two groups, one run at a time on each worker
# (tests/conftest.py)
PYTEST_WORKERS ?= 2

.PHONY: help install demo test test-fast test-cluster lint lock bench-plan

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

install:  ## install the pack for CPU (torch 2.13.0 CPU wheel, pinned deps, dev tools), editable; megatron-core for the tests in build/
	$(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -c requirements/cpu.lock -e ".[dev]"
	$(PYTHON) -m pip install --no-deps --upgrade --target build/megatron-site -r requirements/megatron-site.txt

demo:  ## the embedded CPU demo: python -m recipes.grpo (verl's trainer, tiny model, no GPU)
	$(PYTHON) -m recipes.grpo

test:  ## the whole test suite, end-to-end CPU training included (what CI runs), on 2 workers; the 15 slowest tests
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=15

test-fast:  ## the tests under 5 s each (no training, no child processes, no Ray): marker slow left out
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow"

test-cluster:  ## the tests that start a local Ray cluster on 127.0.0.1 (Ray Jobs, sweeps, NCCL env in a worker)
	$(PYTHON) -m pytest -q -m ray tests/cluster

lint:  ## ruff
	$(PYTHON) -m ruff check recipes hybrid_engine hydra_plugins tests scripts

lock:  ## re-resolve requirements/cpu.lock from pyproject.toml (needs uv)
	uv pip compile pyproject.toml --extra dev -c <(echo torch==2.13.0) --python-version 3.11 --no-header \
		--no-annotate | grep -vE '^(nvidia-|triton|cuda-|klppo)' > requirements/cpu.lock.new
	mv requirements/cpu.lock.new requirements/cpu.lock

bench-plan:  ## time the planner on a 671B MoE over 4096 GPUs and Qwen2-7B over 32
	$(PYTHON) scripts/bench_plan.py
