# Two entry points: `make demo` (set up, then audit models) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-slow test-torchtune mutation-score bench clean

setup:
	@bash scripts/setup.sh 2>&1 | grep -v "^WARNING: Location" || true
	@test -x $(PY)

demo: setup
	$(PY) scripts/demo.py

test: setup
	$(PY) -m pytest -n auto -q -m "not slow"

test-slow: setup
	$(PY) -m pytest -n auto -q -m slow

# torchtune and the torchao it imports live in an environment of their own (pyproject.toml)
test-torchtune:
	@VENV=.venv-torchtune MASKCHECK_EXTRAS=dev,torchtune bash scripts/setup.sh 2>&1 | grep -v "^WARNING: Location" || true
	.venv-torchtune/bin/python -m pytest -n auto -q -m torchtune

mutation-score: setup
	$(PY) scripts/mutation_score.py

bench: setup
	$(PY) benchmarks/audit_overhead.py

clean:
	rm -rf $(VENV) .venv-torchtune .demo *.egg-info maskcheck-report
