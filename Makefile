# Two commands on a fresh machine:
#   make check   set up .venv and run `tfstrategy check` on the default strategy
#   make test    set up .venv and run the test suite
#   make bench   set up .venv and run the benchmarks (tables, benchmarks/results/results.{json,png})
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup check test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[cpu,test,bench]'
	touch $@

check: setup
	$(BIN)/tfstrategy check

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .pytest_cache
