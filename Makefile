# Two commands from a fresh clone: `make demo` (set up, train the lego-cpu model, write its report)
# and `make test` (set up, run the test suite). torch is pinned through constraints.txt and
# installed first, so a CPU machine never pulls the multi-GB CUDA wheels.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow lint benchmark clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/workbench demo

test: $(STAMP)
	$(BIN)/python -m pytest

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

lint: $(STAMP)
	$(BIN)/ruff check tasks models interp analyses tests

benchmark: $(STAMP)
	$(BIN)/workbench benchmark

clean:
	rm -rf $(VENV) runs .pytest_cache
