# `make demo` and `make test` bootstrap .venv/ themselves: one command for each job.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
# The newest Python >= 3.12 on this machine (ansible-core 2.20+ needs it on the controller).
PYTHON ?= $(shell for p in python3.14 python3.13 python3.12 $$(ls -d /root/.pyenv/versions/3.1[2-9]*/bin/python3 $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do \
	  $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo $$p; break; }; done)
# A second virtualenv with the lowest ansible-core that pyproject.toml allows (its `ansible-core>=X` bound;
# .venv resolves the newest the range allows): the plugin and module tests run on both ends of the range.
VENV_MIN := .venv-min
ANSIBLE_CORE_MIN := $(shell sed -n 's/^ *"ansible-core>=\([0-9.]*\),.*/\1/p' pyproject.toml)
MIN_TESTS := tests/unit/test_controller_modules.py tests/unit/test_ansible_interfaces.py tests/unit/test_module_docs.py \
	tests/unit/test_module_prologue.py tests/lab/test_wait_plugin.py tests/unit/test_files_module.py \
	tests/lab/routers/test_module.py tests/lab/pve/test_connection_inventory.py tests/lab/pve/test_vm_module.py \
	tests/lab/pve/test_other_modules.py tests/unit/pve/test_module_secrets.py tests/unit/pve/test_vm_options.py \
	tests/lab/pve/test_download_progress.py tests/lab/test_collection.py
# How many pytest processes the pytest targets run (CI has two cores; 0 runs every test in one process, as plain
# `.venv/bin/pytest` does).
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

# Two more for ansible-test sanity (make sanity), on both ends of the range as the tests: the engine with the
# newest ansible-core (.venv-sanity) and with the lowest (.venv-sanity-min). ansible-test installs its own pinned
# tools in virtualenvs of its own (--requirements), apart from .venv's.
VENV_SANITY := .venv-sanity
VENV_SANITY_MIN := .venv-sanity-min

.PHONY: deps venv venv-min venv-sanity venv-sanity-min demo test lint sanity pytest unit lab e2e unit-min molecule clean \
	docs

# The Debian packages of system-packages.txt that this machine lacks (as root: installed; else the
# apt-get line to run). Every target below runs it first.
deps:
	@scripts/system-deps.sh

venv: $(VENV)/.stamp

$(VENV)/.stamp: pyproject.toml | deps
	@test -n "$(PYTHON)" || { echo "gpulab needs Python >= 3.12 (none found: install python3.12 or newer)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

venv-min: $(VENV_MIN)/.stamp

$(VENV_MIN)/.stamp: pyproject.toml | deps
	@test -n "$(ANSIBLE_CORE_MIN)" || { echo "no ansible-core>=X bound in pyproject.toml"; exit 1; }
	@test -x $(VENV_MIN)/bin/python || $(PYTHON) -m venv $(VENV_MIN)
	$(VENV_MIN)/bin/python -m pip install -q --upgrade pip
	$(VENV_MIN)/bin/python -m pip install -q -e . 'pytest>=8' 'pytest-xdist>=3.8' 'hypothesis>=6.100' 'ansible-core==$(ANSIBLE_CORE_MIN)'
	@touch $@

venv-sanity: $(VENV_SANITY)/.stamp

$(VENV_SANITY)/.stamp: pyproject.toml | deps
	@test -x $(VENV_SANITY)/bin/python || $(PYTHON) -m venv $(VENV_SANITY)
	$(VENV_SANITY)/bin/python -m pip install -q --upgrade pip
	$(VENV_SANITY)/bin/python -m pip install -q -e .
	@touch $@

venv-sanity-min: $(VENV_SANITY_MIN)/.stamp

$(VENV_SANITY_MIN)/.stamp: pyproject.toml | deps
	@test -x $(VENV_SANITY_MIN)/bin/python || $(PYTHON) -m venv $(VENV_SANITY_MIN)
	$(VENV_SANITY_MIN)/bin/python -m pip install -q --upgrade pip
	$(VENV_SANITY_MIN)/bin/python -m pip install -q -e . 'ansible-core==$(ANSIBLE_CORE_MIN)'
	@touch $@

demo: deps venv
	@$(BIN)/gpulab lab status >/dev/null 2>&1 || $(BIN)/gpulab lab up >/dev/null
	$(BIN)/ansible-playbook site.yml -i inventory/demo

test: deps venv lint sanity pytest unit-min molecule

lint: venv
	$(BIN)/ruff check library plugins tests scripts
	$(BIN)/ruff format --check library plugins tests scripts
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint

# ansible-test sanity on the built and installed collection (scripts/sanity.sh), with the newest and the lowest
# ansible-core of the range (tests/sanity/ignore-<version>.txt each; about 2 minutes).
sanity: venv-sanity venv-sanity-min
	GPULAB_SANITY_VENV=$(VENV_SANITY) scripts/sanity.sh
	GPULAB_SANITY_VENV=$(VENV_SANITY_MIN) scripts/sanity.sh

# The tests by cost, each folder mirroring the sources (docs/development.md, "Tests"): tests/unit starts no lab (the
# inner loop: under two minutes on two cores), tests/lab starts one per file or module (labsim servers, network
# namespaces, sshd; most need root), tests/e2e runs site.yml on whole labs (about 7 minutes, as root).
#
# Every pytest test, the three folders in one session, in TEST_WORKERS pytest processes (pytest-xdist): each test
# file runs whole in one of them, and so do the files that share a lab (tests/simlab.py SHARED_LABS,
# tests/conftest.py's scheduler), so a module's or a group's lab comes up once; while one worker's lab test waits
# on its hosts, the other works.
pytest: venv
	$(BIN)/pytest $(XDIST) --durations=30

unit: venv
	$(BIN)/pytest $(XDIST) tests/unit

lab: venv
	$(BIN)/pytest $(XDIST) tests/lab

# The plugin and module tests again on the lowest ansible-core pyproject.toml allows (about 2 minutes).
unit-min: venv-min
	$(VENV_MIN)/bin/pytest -q -p no:cacheprovider $(XDIST) $(MIN_TESTS)

# Only the whole-lab proofs (bad input through site.yml, faults, secrets at -vvv, the converged demo lab's stack).
e2e: venv
	$(BIN)/pytest $(XDIST) tests/e2e

# The whole site.yml on the simulated lab: check run on a fresh lab, converge, idempotence, verify; first on
# the demo lab (default), then adopting the user's hand-made lab as it runs, behind its Huawei ONT
# (homelab-running, about 3 minutes), then the
# two-node cluster with three k3s servers, a server VM stopped and the upgrade (cluster, about 8 minutes). As in
# pytest (tests/conftest.py), the labs' unattended-upgrades hold apt's locks 8 s after each boot, not 25 s.
molecule: venv
	@if [ "$$(id -u)" = 0 ]; then export GPULAB_LAB_APT_HOLD_S=8; \
	$(BIN)/molecule test && $(BIN)/molecule test -s homelab-running && $(BIN)/molecule test -s cluster; \
	else echo "molecule: skipped: the simulated lab's hosts need root (network namespaces)"; fi

clean:
	rm -rf $(VENV) $(VENV_MIN) $(VENV_SANITY) $(VENV_SANITY_MIN) .pytest_cache .ruff_cache

docs: venv
	$(BIN)/python -m gpulab.docs .
