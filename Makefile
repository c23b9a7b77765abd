# Two commands matter: `make demo` and `make test`. Each sets up .venv first if it is missing.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEMO    ?= runs/demo
# pytest workers: 2 matches the CI machine; override with `make test JOBS=1`
JOBS    ?= 2

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip<26"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	# the `legacy` extra (deepspeed, for importing DeepSpeed ZeRO checkpoints) builds against the installed
	# torch, so without build isolation (which would fetch another torch) and with `wheel` present
	$(BIN)/python -m pip install -q -c constraints.txt wheel
	$(BIN)/python -m pip install -q --no-build-isolation -c constraints.txt deepspeed
	touch $(STAMP)

# the lint gate of `make test` alone; `$(BIN)/ruff format .` applies the formatting
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: $(STAMP)
	$(BIN)/python -m gcc.tools.demo --out $(DEMO)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n $(JOBS) -q -rs --durations=25 tests

bench: $(STAMP)
	$(BIN)/python bench/convert.py

clean:
	rm -rf $(VENV) runs
