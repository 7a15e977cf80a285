# tk: the two commands are `make compare OP=gelu` and `make test`.
# Each sets up a virtual environment (.venv) the first time and reuses it.
#
# On a machine that already has torch and triton (a GPU box, no network):
#   make test USE_SYSTEM=1      # runs with the system python, installs nothing

PYTHON       ?= python3
VENV         ?= .venv
TORCH_SPEC   ?= torch==2.13.0
TORCH_INDEX  ?=
USE_SYSTEM   ?= 0
OP           ?= gelu
OUT          ?= logs
DTYPES       ?=
SHAPES       ?=
VARIANTS     ?=
QUICK        ?= 0
MAX_AUTOTUNE ?= 0
CONFIGS      ?= 0
DEVICE       ?=
GPUS         ?=
RUNS         ?=
ARGS         ?=
TOOL         ?= torch

# ---------------------------------------------------------------------------
# Settings given on the command line are checked before anything runs: a
# misspelled one (op=softmax, DTYPE=bf16) would otherwise be ignored, and the
# default sweep would run instead of the one asked for.
# ---------------------------------------------------------------------------

SETTINGS := PYTHON VENV TORCH_SPEC TORCH_INDEX USE_SYSTEM OP OUT DTYPES SHAPES VARIANTS QUICK MAX_AUTOTUNE \
            CONFIGS DEVICE GPUS RUNS ARGS TOOL
given    := $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
unknown  := $(filter-out $(SETTINGS) MAKEFLAGS MAKEOVERRIDES MFLAGS -%,$(given))
upper     = $(shell echo '$(1)' | tr a-z A-Z)
hint      = $(or $(filter $(call upper,$(1)) $(call upper,$(1))S,$(SETTINGS)),one of the settings below)
ifneq ($(unknown),)
$(error unknown setting $(firstword $(unknown))=$($(firstword $(unknown))): did you mean $(call hint,$(firstword $(unknown)))? \
Settings: $(SETTINGS) (see make help))
endif

# QUICK=1, true, yes, on are the same; 0, false, no, off or empty turn it off.  Refused when given on the
# command line; from the environment (where CONFIGS may mean something else) a value neither yes nor no is off.
truth     = $(if $(filter 1 true yes on TRUE YES ON True Yes On,$($(1))),1,$(if $(filter-out 0 false no off FALSE NO OFF False No Off,$($(1))),bad,))
$(foreach v,QUICK MAX_AUTOTUNE CONFIGS USE_SYSTEM,$(if $(filter bad,$(call truth,$(v))),\
  $(if $(filter command line,$(origin $(v))),$(error $(v)=$($(v)) is not a yes or a no: use $(v)=1 or $(v)=0))))

$(if $(filter-out torch ncu,$(TOOL)),$(error TOOL=$(TOOL): make profile takes TOOL=torch (torch.profiler) or TOOL=ncu (Nsight Compute)))

ifeq ($(call truth,USE_SYSTEM),1)
PY    := PYTHONPATH=$(CURDIR) $(PYTHON)
SETUP := check-system
else
PY    := $(VENV)/bin/python
SETUP := $(VENV)/.installed
endif

COMPARE_FLAGS = --op $(OP) --out $(OUT) $(if $(DTYPES),--dtypes $(DTYPES)) $(if $(SHAPES),--shapes $(SHAPES)) \
  $(if $(VARIANTS),--variants $(VARIANTS)) $(if $(filter 1,$(call truth,QUICK)),--quick) \
  $(if $(filter 1,$(call truth,MAX_AUTOTUNE)),--max-autotune) $(if $(filter 1,$(call truth,CONFIGS)),--configs) $(if $(GPUS),--gpus $(GPUS)) \
  $(ARGS)

# make ir: every compiled level of OP's tk kernels, planned and compiled for an H100 on any machine.
IR_FLAGS = --op $(OP) --out $(OUT) $(if $(DTYPES),--dtypes $(DTYPES)) $(if $(SHAPES),--shapes $(SHAPES)) $(ARGS)

# make profile: one shape (the first of a quick sweep) unless SHAPES says which; TOOL=torch or ncu.
PROFILE_FLAGS = --op $(OP) --out $(OUT) $(if $(DTYPES),--dtypes $(DTYPES)) $(if $(SHAPES),--shapes $(SHAPES),--quick) \
  $(if $(VARIANTS),--variants $(VARIANTS)) $(if $(filter ncu,$(TOOL)),--ncu,--profile) $(if $(GPUS),--gpus $(GPUS)) $(ARGS)

.PHONY: help test test-gpu compare bench overhead summary ir profile clean clean-logs check-system

help:  ## list the targets and settings
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16
	@echo
	@echo "settings: OP DTYPES SHAPES VARIANTS QUICK=1 MAX_AUTOTUNE=1 CONFIGS=1 OUT GPUS=4|all (compare, bench),"
	@echo "          DEVICE (overhead), TOOL=torch|ncu (profile), RUNS (summary), ARGS (passed on as they are),"
	@echo "          USE_SYSTEM=1, TORCH_SPEC, TORCH_INDEX, PYTHON"

test: $(SETUP)  ## run the test suite (GPU tests skip without CUDA)
	$(PY) -m pytest -q $(ARGS)

test-gpu: $(SETUP)  ## run only the GPU tests (pytest -m gpu)
	$(PY) -m pytest -q -m gpu $(ARGS)

compare: $(SETUP)  ## compare every variant of OP (OP=all; DTYPES, SHAPES, VARIANTS, QUICK=1, MAX_AUTOTUNE=1, CONFIGS=1, OUT, GPUS)
	@echo "python -m compare $(strip $(COMPARE_FLAGS))"
	@$(PY) -m compare $(COMPARE_FLAGS)

bench: $(SETUP)  ## the full sweep of every op (on a GPU: the default GPU sweep; GPUS=4 or all: one worker per GPU)
	@echo "python -m compare --op all --out $(OUT) $(strip $(if $(GPUS),--gpus $(GPUS)) $(ARGS))"
	@$(PY) -m compare --op all --out $(OUT) $(if $(GPUS),--gpus $(GPUS)) $(ARGS)

overhead: $(SETUP)  ## host time per call of tiny tk ops against eager (OP, DTYPES, DEVICE=cpu|cuda)
	@$(PY) -m compare.overhead --op $(OP) $(if $(DTYPES),--dtype $(DTYPES)) $(if $(DEVICE),--device $(DEVICE)) $(ARGS)

ir: $(SETUP)  ## TTIR, TTGIR, LLIR, PTX, SASS of OP's tk kernels per shape, compiled for an H100 on any machine (OUT/ir/OP)
	@echo "python -m compare.ir $(strip $(IR_FLAGS))"
	@$(PY) -m compare.ir $(IR_FLAGS)

profile: $(SETUP)  ## profile OP's variants on one shape: TOOL=torch (Chrome traces, key_averages) or TOOL=ncu (Nsight Compute, GPU)
	@echo "python -m compare $(strip $(PROFILE_FLAGS))"
	@$(PY) -m compare $(PROFILE_FLAGS)

summary: $(SETUP)  ## one page over several runs: RUNS="logs/runs/A logs/runs/B" (OUT=file.md to write it)
	@$(if $(RUNS),,echo "make summary needs RUNS=\"<run folder> ...\" (folders under $(OUT)/runs)"; exit 2;)
	@$(PY) -m compare.summary $(RUNS) $(if $(filter-out logs,$(OUT)),--out $(OUT)) $(ARGS)

clean-logs:  ## remove every harness run and the logs/<op> pointers (keeps logs/README.md, logs/examples)
	rm -rf $(OUT)/runs
	find $(OUT) -maxdepth 1 -type l -delete

clean:  ## remove the virtual environment
	rm -rf $(VENV)

$(VENV)/.installed: pyproject.toml
	@echo "Setting up $(VENV) (once; later runs reuse it)"
	@echo "[1/3] creating the virtual environment with $(PYTHON)"
	@$(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/python -m pip install -q --upgrade pip
	@echo "[2/3] installing $(TORCH_SPEC)$(if $(TORCH_INDEX), from $(TORCH_INDEX)) (a CPU build is about 200 MB, a CUDA build several GB)"
	@$(VENV)/bin/python -m pip install --progress-bar on "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	@echo "[3/3] installing tk and its test tools (triton, numpy, tabulate, matplotlib, ninja, pytest, hypothesis)"
	@$(VENV)/bin/python -m pip install --progress-bar on -e ".[test]"
	@touch $@
	@echo "$(VENV) is ready"

check-system:
	@$(PYTHON) -c "import torch, triton, tabulate, matplotlib, pytest" || \
	  { echo "USE_SYSTEM=1 needs torch, triton, tabulate, matplotlib and pytest installed"; exit 1; }
