# The README's two commands are `make serve` and `make test`; each does its own set-up.
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip --disable-pip-version-check -q
TORCH  := torch==2.13.0

.PHONY: serve test lint typecheck check setup setup-dev clean

# Installs torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
$(BIN)/.runtime: pyproject.toml setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH)
	$(PIP) install -e .
	@touch $@

$(BIN)/.dev: $(BIN)/.runtime
	$(PIP) install -e '.[dev]'
	@touch $@

setup: $(BIN)/.runtime
setup-dev: $(BIN)/.dev

serve: $(BIN)/.runtime
	$(BIN)/hydrant serve

test: $(BIN)/.dev
	@bash .ci/services
	$(BIN)/pytest

lint: $(BIN)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.dev
	bash .ci/typecheck

check: lint typecheck test

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
