# tk: the two commands are `make compare OP=gelu` and `make test`.
# Each sets up a virtual environment (.venv) the first time and reuses it.
#
# On a machine that already has torch and triton (a GPU box, no network):
#   make test USE_SYSTEM=1      # runs with the system python, installs nothing

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
USE_SYSTEM ?= 0
OP         ?= gelu
OUT        ?= logs
DTYPES     ?=
SHAPES     ?=
VARIANTS   ?=
QUICK      ?= 0
MAX_AUTOTUNE ?= 0
ARGS       ?=

ifeq ($(USE_SYSTEM),1)
PY    := PYTHONPATH=$(CURDIR) $(PYTHON)
SETUP := check-system
else
PY    := $(VENV)/bin/python
SETUP := $(VENV)/.installed
endif

.PHONY: help test test-gpu compare bench clean clean-logs check-system

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

test: $(SETUP)  ## run the test suite (GPU tests skip without CUDA)
	$(PY) -m pytest -q $(ARGS)

test-gpu: $(SETUP)  ## run only the GPU tests (pytest -m gpu)
	$(PY) -m pytest -q -m gpu $(ARGS)

compare: $(SETUP)  ## compare every variant of OP (OP=all; DTYPES, SHAPES, VARIANTS, QUICK=1, MAX_AUTOTUNE=1, OUT)
	$(PY) -m compare --op $(OP) --out $(OUT) \
	  $(if $(DTYPES),--dtypes $(DTYPES)) $(if $(SHAPES),--shapes $(SHAPES)) \
	  $(if $(VARIANTS),--variants $(VARIANTS)) $(if $(filter 1,$(QUICK)),--quick) \
	  $(if $(filter 1,$(MAX_AUTOTUNE)),--max-autotune) $(ARGS)

bench: $(SETUP)  ## the full sweep of every op (on a GPU: the default GPU sweep)
	$(PY) -m compare --op all --out $(OUT) $(ARGS)

clean-logs:  ## remove every harness run and the logs/<op> pointers (keeps logs/README.md, logs/examples)
	rm -rf $(OUT)/runs
	find $(OUT) -maxdepth 1 -type l -delete

clean:  ## remove the virtual environment
	rm -rf $(VENV)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/python -m pip install -q -e ".[test]"
	touch $@

check-system:
	@$(PYTHON) -c "import torch, triton, tabulate, matplotlib, pytest" || \
	  { echo "USE_SYSTEM=1 needs torch, triton, tabulate, matplotlib and pytest installed"; exit 1; }
