# Two commands on a fresh machine:
#   make check       set up .venv and run `tfstrategy check` on the default strategy
#   make test        set up .venv (and .venvs/extras) and run the whole test suite, every tier, on two pytest workers (what CI runs)
# For developers:
#   make test-extended  only the long real-world tier (make test runs it too): the corpus of public scripts, Ray, joins after early ops, backup faults, the benchmark run
#   make test-fast   the edit-test loop: no worker processes, no long training (CONTRIBUTING: the measured times)
#   make lint        ruff, mypy (strict over the whole package), the import-linter contracts (pyproject.toml) and tests/test_rules.py
#   make versions    the smoke set on the oldest supported TensorFlow/Keras and on tf_keras (own venvs)
#   make bench       the benchmarks (tables, benchmarks/results/results.{json,png})
#   make docs        the documentation site, strictly (a broken link or missing docstring fails): site/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The Ray and bench extras (Ray Train pulls pandas and pyarrow; bench, matplotlib) live in a venv of their own:
# where they are installed, Keras imports pandas and matplotlib.pyplot while TensorFlow imports, 1 s of the
# 4 s every TensorFlow process of the suite starts with (measured: tests/launch, 117 s -> 101 s). .venv is
# what `pip install tfstrategy[cpu]` gives a user; the tests marked `extras` run in EXTRAS.
EXTRAS ?= .venvs/extras
EXTRAS_BIN := $(EXTRAS)/bin

.PHONY: setup check test test-extended test-fast lint versions bench docs clean

setup: $(VENV)/.test-installed $(EXTRAS)/.installed

# What `make check` needs: tfstrategy and tensorflow-cpu (pip shows each download: a cold cache fetches
# about 600 MB). The tests' extras (pytest; in .venvs/extras the benchmarks' plotting and Ray: about 2 GB
# more) come with the first `make test`.
$(VENV)/.installed: pyproject.toml
	@echo "make: installing tfstrategy and tensorflow-cpu into $(VENV) (a few minutes on a cold cache)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar on -e '.[cpu]'
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	@echo "make: installing the test extra into $(VENV)"
	$(BIN)/pip install --progress-bar on -e '.[cpu,test]'
	touch $@

$(EXTRAS)/.installed: pyproject.toml
	@echo "make: installing tfstrategy with the test, benchmark and Ray extras into $(EXTRAS) (for the tests marked extras)"
	$(PYTHON) -m venv $(EXTRAS)
	$(EXTRAS_BIN)/pip install --quiet --upgrade pip
	$(EXTRAS_BIN)/pip install --progress-bar on -e '.[cpu,test,bench,ray]'
	touch $@

check: $(VENV)/.installed
	$(BIN)/tfstrategy check

# Two pytest workers, each test module whole on one of them (--dist loadfile: its module fixtures, such as the Ray
# cluster, are made once; pytest 9.2's Node.nodeid broke xdist 3.8's loadgroup). Three were measured (2026-12-07):
# the cores 81-86% busy instead of idle at times, but the first session no shorter (25:10 and 26:05 against 25:37 and
# 28:23 on two), and the in-process tests that train on 4 replicas 3-4x slower (93 s for a 20 s test, near the
# 120 s ceiling): the tests' own processes outnumber the cores already.
# Two Slurm clusters never run at once (tests/slurm_cluster.py). TEST_WORKERS=0: serially.
# A pytest worker that crashes (a segfault in TensorFlow) ends the run at once: after a crash,
# xdist 3.8's loadfile scheduler was seen to leave the replacement worker and the controller
# waiting on each other with tests left, which would hold CI until its time limit.
TEST_WORKERS ?= 2
TEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --max-worker-restart 0)

# Two sessions, one after the other: every test but those marked extras in .venv, then those (Ray's two-node
# cluster, the benchmarks' run) in .venvs/extras. Measured: at once, the second in the background, took as long
# (28:39 against 28:41): the suite is CPU-bound.
test: setup lint
	$(BIN)/python -m pytest $(TEST_PARALLEL) -m "not extras" --durations=25
	$(EXTRAS_BIN)/python -m pytest $(TEST_PARALLEL) -m extras --durations=10

test-extended: setup
	$(BIN)/python -m pytest -m "extended and not extras"
	$(EXTRAS_BIN)/python -m pytest -m "extended and extras"

test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not multiprocess and not extras" -q $(TEST_PARALLEL)

lint: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_rules.py

versions:
	bash .ci/versions

bench: setup
	$(BIN)/python benchmarks/run.py

$(VENV)/.docs-installed: $(VENV)/.test-installed
	$(BIN)/pip install --quiet -e '.[cpu,test,docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .venvs .pytest_cache site
