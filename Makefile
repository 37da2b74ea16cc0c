# packsim: the two commands a newcomer needs are `make lab` (the course) and `make test`.
#
# Environment: the active virtualenv or conda env if there is one, else a local .venv.
# torch is installed first, if the environment has none. On Linux without an NVIDIA GPU (no
# nvidia-smi) it is the CPU wheel from PyTorch's CPU index (TORCH_INDEX), not pip's default
# CUDA build (several GB). TORCH_INDEX= (empty) turns that off: pip's default build.
# TORCH_SPEC picks the build yourself (e.g. TORCH_SPEC="torch==2.13.0", a CPU wheel your pip can
# see); with TORCH_SPEC set, no index is added unless you also set TORCH_INDEX.
# packsim is installed editable with the course extra (the notebooks: jupyterlab, plotly, TRL, ...)
# and the dev extra (the tests); `pip install packsim` alone is the library, the audit and the CLI.
# Every install takes the lock (LOCK, constraints/lock.txt: the exact versions the tests passed on),
# so a learner gets what was tested; `make lock` refreshes it from the newest releases, LOCK= turns it off.

SHELL := /bin/bash
PYTHON ?= python3
ifeq ($(origin TORCH_SPEC)$(shell uname -s)$(shell command -v nvidia-smi),undefinedLinux)
  TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
endif
TORCH_SPEC ?= torch>=2.6
TORCH_INDEX ?=
LOCK ?= constraints/lock.txt
LOCK_FLAG := $(if $(LOCK),-c $(LOCK))
LAB_ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (tests/conftest.py schedules one test file, or one notebook, per unit)
PYTEST_WORKERS ?= 2

ifneq ($(VIRTUAL_ENV)$(CONDA_DEFAULT_ENV),)
  PY := python
  ENV_DIR := $(shell python -c 'import sys; print(sys.prefix)')
  NEW_VENV :=
else
  PY := .venv/bin/python
  ENV_DIR := .venv
  NEW_VENV := .venv/bin/python
endif
STAMP := $(ENV_DIR)/.packsim-setup.stamp

.PHONY: setup git-filter lab test check html clean help bench bench-quick gpu-check lock test-window axolotl

help:
	@echo "make lab    set up (first run only) and open the course in JupyterLab"
	@echo "make test   set up (first run only) and run the whole test suite"
	@echo "make check  lint (ruff) and check notebooks carry no outputs"
	@echo "make git-filter  (run by setup) strip notebook outputs from what git stores (nbstripout)"
	@echo "make html   execute the course into static HTML in site/ (offline; PACKSIM_FAST=1 for the quick one)"
	@echo "make bench  CPU benchmarks (packing vs TRL, attention, throughput; ~15-22 min) -> benchmarks/results"
	@echo "make bench-quick  the same in quick mode (< 2 min) -> runs/bench-quick"
	@echo "make lock   refresh constraints/lock.txt from the newest releases (then run make test)"
	@echo "make test-window  the audit, kernel and trainer tests on the window's ends (Axolotl 0.19's pins, the newest releases)"
	@echo "make axolotl  Axolotl 0.19's sample packing audited live in its own .venv-axolotl (~10 min) -> results/axolotl"
	@echo "make gpu-check  on a CUDA machine: GPU tests, reference vs real kernels, kernels, packed vs padded, compare (< 10 min) -> benchmarks/results/gpu_check.json"

.venv/bin/python:
	$(PYTHON) -m venv .venv

$(STAMP): pyproject.toml $(LOCK) | $(NEW_VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install $(LOCK_FLAG) "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install $(LOCK_FLAG) -e ".[course,dev]"
	$(PY) -m packsim.commands.doctor --quiet --course
	touch $(STAMP)

setup: $(STAMP) git-filter

# Notebook outputs never land in git by accident: JupyterLab autosaves them into the notebooks,
# and this git filter (nbstripout, a dev dependency; .gitattributes names it) strips them from
# what `git add` stores, while your copy on disk keeps them. It also drops what a run adds to
# metadata.language_info (your Python version, lexer, mimetype...; the committed notebooks keep
# only its name). Cell ids are kept (--keep-id), so a clean notebook passes through unchanged.
# Outside a git checkout there is nothing to do.
git-filter:
	@if git rev-parse --git-dir >/dev/null 2>&1; then \
	  $(PY) -m nbstripout --install --attributes .gitattributes && \
	  keys="metadata.language_info.codemirror_mode metadata.language_info.file_extension" && \
	  keys="$$keys metadata.language_info.mimetype metadata.language_info.nbconvert_exporter" && \
	  keys="$$keys metadata.language_info.pygments_lexer metadata.language_info.version" && \
	  strip="$$($(PY) -c 'import sys; print(sys.executable)') -m nbstripout --keep-id --extra-keys '$$keys'" && \
	  git config filter.nbstripout.clean "$$strip" && \
	  git config diff.ipynb.textconv "$$strip -t" && \
	  echo "git filter: notebook outputs are stripped on git add (nbstripout; see README)"; fi

# The lock: a fresh venv (.venv-lock) takes the newest releases pip sees for packsim[course,dev], and
# its `pip freeze` (packsim itself and torch's local build label left out) becomes constraints/lock.txt.
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	.venv-lock/bin/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	.venv-lock/bin/python -m pip install -q -e ".[course,dev]"
	.venv-lock/bin/python -m packsim.course.tools.lock .venv-lock constraints/lock.txt
	rm -rf .venv-lock

# The window's two ends (packsim/core/upstream/window.py), each in its own venv: `low`, the stack
# Axolotl 0.19.0 pins (constraints/axolotl-0.19.txt, with its kernels), and `new`, the newest
# releases on the index (skipped, saying so, when they are exactly the lock the main run tested).
test-window:
	bash .ci/window low
	bash .ci/window new

# Axolotl's sample packing, audited live (benchmarks/axolotl/README.md): axolotl 0.19.0 and its own pins in
# .venv-axolotl (not the course's), its YAML configs, multipack sampler, collator and trainer, each entry
# point's verdict beside a ground truth computed without packsim -> results/axolotl/{axolotl_live.json,table.md}
axolotl:
	bash benchmarks/axolotl/setup.sh
	.venv-axolotl/bin/python benchmarks/axolotl/run.py

# JupyterLab refuses to start as root (containers, some cloud VMs) without --allow-root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: setup
	$(PY) -m jupyter lab --ServerApp.root_dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

test: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

check: setup
	$(PY) -m ruff check packsim tests benchmarks
	$(PY) -m packsim.course.tools.notebook_tools check-clean notebooks

# Static course (packsim/course/tools/static_site.py): executes every notebook; npm fetches the widget manager once.
html: setup
	$(PY) -m packsim.course.tools.static_site notebooks --out site

clean:
	rm -rf .venv .pytest_cache .ruff_cache .hypothesis site runs build

# Benchmarks (benchmarks/README.md): speed and memory are measured here, never asserted in tests.
bench: setup
	$(PY) benchmarks/packing.py
	$(PY) benchmarks/from_examples.py
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/plots.py

bench-quick: setup
	$(PY) benchmarks/packing.py --quick
	$(PY) benchmarks/from_examples.py --n 20000 --repeats 1 --out runs/bench-quick
	$(PY) benchmarks/attention.py --quick
	$(PY) benchmarks/throughput.py --quick
	$(PY) benchmarks/plots.py --dir runs/bench-quick

# The one GPU check (benchmarks/gpu_check.py): on a CUDA machine with torch, triton and
# transformers only, so no setup step; without CUDA it says so in one line and exits 0.
gpu-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) benchmarks/gpu_check.py
