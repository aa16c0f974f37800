# Two commands from a fresh clone: `make demo` (set up, train the composite-cpu model, analyse it, write its report)
# and `make test` (set up, run the test suite). torch is pinned through constraints.txt and
# installed first, from TORCH_INDEX when it is set (below), else from pip's own index.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# TORCH_INDEX: a PyTorch wheel index to take torch from: https://download.pytorch.org/whl/cpu for the
# CPU build, or a CUDA build's (pytorch.org/get-started). Empty: pip's own configuration, which on
# PyPI means the Linux x86-64 CUDA build and its CUDA libraries; a pip set up to find a CPU wheel
# (as on our CI machines) takes that.
TORCH_INDEX ?=

# the suite runs in this many processes (pytest-xdist), each test file in one of them
PYTEST_WORKERS ?= 2

.PHONY: setup demo test test-quick test-slow lint benchmark gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/workbench demo

test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

# the loop before a commit: unit tests and one smoke test of every command
test-quick: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile tests/unit tests/smoke

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

lint: $(STAMP)
	$(BIN)/ruff check tasks models interp analyses tests

benchmark: $(STAMP)
	$(BIN)/workbench benchmark

# With a GPU: the gpu tests, the CUDA benchmark and one gpu-scale study (README, "With a GPU")
gpu-check: $(STAMP)
	@$(BIN)/python -c "import sys, torch; torch.cuda.is_available() or sys.exit('gpu-check: torch ' + torch.__version__ + ' sees no CUDA device; install a CUDA build of torch (README, With a GPU)')"
	$(BIN)/python -m pytest -m gpu
	$(BIN)/workbench benchmark --device cuda
	$(BIN)/workbench benchmark --ensemble 16 --device cuda
	$(BIN)/workbench study lego-extrapolation --scale gpu

clean:
	rm -rf $(VENV) runs .pytest_cache
