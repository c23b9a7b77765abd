# Two commands matter: `make demo` and `make test`. Each sets up .venv first if it is missing.
SHELL   := /bin/bash
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEMO    ?= runs/demo
SYNTHETIC ?= runs/synthetic
# pytest workers: 2 matches the CI machine; override with `make test JOBS=1`
JOBS    ?= 2
# tests handed out one at a time (the long ones first: tests/conftest.py), so no worker idles at the end
PYTEST  := $(BIN)/python -m pytest -n $(JOBS) --maxschedchunk 1 -q -rs
# the wall and CPU time of everything the command ran (every process it started), printed when it ends
TIMED   = TIMEFORMAT="$@: %0R s wall, %0U s user + %0S s sys CPU"; time
# the lint gate: ruff (lint, then formatting; `$(BIN)/ruff format .` applies the formatting), then mypy (types; what
# it checks and how strictly: [tool.mypy] in pyproject.toml)
RUFF    := $(BIN)/ruff check . && $(BIN)/ruff format --check .
LINT    := $(RUFF) && $(BIN)/mypy
# ruff first (a second), then mypy beside pytest: mypy is one single-threaded process (~25 s cold), and pytest leaves
# a core idle while its launches wait; either failing fails the target
CHECKED = $(RUFF) && $(BYTECODE) && { $(BIN)/mypy & mypy=$$!; $(PYTEST) $(1); status=$$?; wait $$mypy && exit $$status; }
# gcc's and the tests' modules compiled once, before the tests: every launch's processes import gcc, and where the
# environment sets PYTHONDONTWRITEBYTECODE each of them would compile it anew (~0.3 s of CPU a process, a few hundred
# processes in `make test`); a compiled module whose source then changes is recompiled as usual
BYTECODE = $(BIN)/python -m compileall -q -j 0 gcc tests

.PHONY: setup demo synthetic test test-fast durations lint bench mutants clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip<26"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	# the `legacy` extra (deepspeed), for the tests of the legacy DeepSpeed ZeRO import: a user's `pip install -e .`
	# does not need it. It builds against the installed torch, so without build isolation (which would fetch another
	# torch) and with `wheel` present
	$(BIN)/python -m pip install -q -c constraints.txt wheel
	$(BIN)/python -m pip install -q --no-build-isolation -c constraints.txt deepspeed
	touch $(STAMP)

# the lint gate of `make test` alone
lint: $(STAMP)
	$(LINT)

demo: $(STAMP)
	$(BIN)/python -m gcc.tools.demo --out $(DEMO)

# the README's "On synthetic data" commands, exactly as written (the block between its synthetic-path markers), run
# in a scratch folder beside links to gcc/ and yamls/ (tests/readme_synthetic.py)
synthetic: $(STAMP)
	$(BIN)/python tests/readme_synthetic.py $(SYNTHETIC)

# everything (CI): the lint gate and every test; ends with its wall and CPU time
test: $(STAMP)
	@$(TIMED) ( $(call CHECKED,--durations=25 tests) )

# the edit loop: the lint gate and the tests not marked slow (unit, contract and in-process tests), a few minutes
test-fast: $(STAMP)
	@$(TIMED) ( $(call CHECKED,-m "not slow" tests) )

# tests/durations.json anew (each test's time in a full run: the order tests are handed out in)
durations: $(STAMP)
	GCC_DURATIONS_OUT=tests/durations.json $(PYTEST) tests

# mutation testing of one core module against the tests that cover it (the table: tests/mutants.py `MODULES`; the
# scores and the mutants judged equivalent: docs/mutation.md), one mutant at a time in runs/mutants/<module>/; slow
# (minutes to an hour a module), so not part of `make test`. `make mutants MODULE=gcc/data/mask.py`; after adding
# tests, `MUTANTS_ARGS=--again` runs only the mutants the last run left alive
mutants: $(STAMP)
	$(BIN)/python tests/mutants.py $(MODULE) $(MUTANTS_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/convert.py

clean:
	rm -rf $(VENV) runs
