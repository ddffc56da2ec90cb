# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PIP    := $(PY) -m pip --disable-pip-version-check
# Three workers, one test file each at a time (module fixtures run once, a file's tests share
# a worker): most tests wait on simulated devices, so two cores overlap three of them (ADR 0013).
PYTEST := $(PY) -m pytest -q -n 5 --dist loadfile

# Debian packages the suite needs and never installs itself: systemd-analyze
# (tests/test_systemd_unit.py) and the toolchain of the C++ client in docs/protocols/zeromq.md
# (tests/test_zmq_doc.py). This is the one list; the tests point to `make os-deps`.
OS_PACKAGES := systemd g++ libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
# Headless Chromium renders the HTML report in tests/test_report_html.py.
OS_PACKAGES += chromium-headless-shell
# The plant interfaces' peers (tests/test_plant_mqtt.py, tests/test_plant_metrics.py): a real
# MQTT broker and a real Prometheus server, started by the tests on 127.0.0.1.
OS_PACKAGES += mosquitto prometheus
# Aravis's fake GigE Vision camera, its command-line tools and its GObject binding (through the
# system Python) are the independent peers of the camera tests (tests/test_gige_aravis.py,
# tests/test_gige_sim_peers.py); strace shows where every datagram of theirs and ours goes
# (ADR 0020).
OS_PACKAGES += aravis-tools aravis-tools-cli gir1.2-aravis-0.8 python3-gi strace
# PyYAML of the system Python reads the ROS camera_info export back, as ROS's Python side
# does (tests/test_intrinsics_outputs.py, ADR 0030).
OS_PACKAGES += python3-yaml

.PHONY: demo test check test-stress os-deps lint bytecode bench bench-figaroh clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Re-install when pyproject.toml changes; the install is editable so code edits need nothing.
# $(STAMP): the runtime dependencies only (what `make demo` needs); $(STAMP)-EXTRA: with an extra.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet -e .
	touch $@

$(STAMP)-%: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[$*]"
	touch $@

# Installs the missing OS_PACKAGES with apt-get when it can (root, apt-get present); else says
# the command to run and fails. Nothing to do (and no `apt-get update`) when all are present.
os-deps:
	@command -v dpkg-query >/dev/null || { \
	  echo "os-deps: no dpkg-query (not Debian?): cannot check for the suite's OS packages: $(OS_PACKAGES)"; exit 0; }; \
	missing=; for p in $(OS_PACKAGES); do \
	  dpkg-query -W -f='$${db:Status-Abbrev}' $$p 2>/dev/null | grep -q '^ii' || missing="$$missing $$p"; \
	done; \
	[ -n "$$missing" ] || exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "os-deps: missing Debian packages:$$missing"; \
	  echo "os-deps: install them (as root) with: apt-get update && apt-get install -y --no-install-recommends$$missing"; \
	  exit 1; \
	fi; \
	echo "os-deps: installing$$missing"; \
	log=$$(mktemp); \
	if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; } \
	    >"$$log" 2>&1; then \
	  cat "$$log"; rm -f "$$log"; \
	  echo "os-deps: apt-get failed (output above); the command was: apt-get install -y --no-install-recommends$$missing"; \
	  exit 1; \
	fi; \
	rm -f "$$log"

# Static checks: ruff (lint and import order) over every Python folder, mypy over the package.
# The folders install as cellcal.<folder> through package-dir, which mypy cannot follow, so it
# reads them through a tree of symlinks under build/ that has the installed layout.
TYPECHECK := build/typecheck
lint: $(STAMP)-test
	$(VENV)/bin/ruff check solver drivers sim daemon tests bench
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/cellcal && \
	for d in solver drivers sim daemon; do ln -s "$$PWD/$$d" $(TYPECHECK)/cellcal/$$d; done; \
	ln -s "$$PWD/daemon/testing" $(TYPECHECK)/cellcal/testing
	MYPYPATH=$(TYPECHECK) $(VENV)/bin/mypy --cache-dir build/.mypy_cache \
	  -p cellcal.solver -p cellcal.drivers -p cellcal.sim -p cellcal.daemon -p cellcal.testing

# The simulated cell end to end: sim robot (RTDE) + sim tracker + daemon, a full
# base-frame calibration, the report and one drift check. Only the runtime dependencies are
# installed: the demo needs no test tool (tests/test_packaging.py runs it from the bare wheel).
demo: $(STAMP)
	$(VENV)/bin/cellcal demo

# The package's bytecode, compiled before the suite runs: the tests start a few hundred
# processes (the cellcal command, simulators, daemons), and with PYTHONDONTWRITEBYTECODE set
# (as on this project's machines) each of them compiled the ~70,000 lines of solver/, drivers/,
# sim/ and daemon/ again: 0.85 s of CPU for one `cellcal solve` of 20 stations, 0.48 s with
# the bytecode. Python reads __pycache__ whatever that variable says; it only stops writing it.
# A file edited since is simply compiled again (its timestamp no longer matches).
# The same holds for the tests' modules, which pytest rewrites (assertions) and compiles when it
# collects them: with that variable set, each of the five workers did it again for all of
# them, 10 s of CPU per worker before the first test. One collection with writing on caches
# the rewritten modules in tests/__pycache__ (9 s once); a worker then collects in 3.5 s.
bytecode: | $(PY)
	$(PY) -m compileall -q -j 0 solver drivers sim daemon config >/dev/null
	@mkdir -p build && PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q --collect-only -p no:cacheprovider \
	  tests >build/collect.log 2>&1 || { cat build/collect.log; exit 1; }

test: os-deps $(STAMP)-test lint bytecode
	$(PYTEST)

# The fast tier for the developer's loop (under 2 minutes on 2 cores): lint, then every test not
# marked slow (unit, codec, solver and property tests; nothing that runs a simulated cell in real
# time or starts a process). `make test` (what .ci/run calls) runs everything.
check: $(STAMP)-test lint bytecode
	$(PYTEST) -m "not slow"

# The whole suite with two CPU-burning processes beside it (the suite must pass on a loaded
# 2-core machine). The burners are killed however pytest ends, and also stop by themselves
# if this shell dies without that (they watch their parent).
BURN := import os; p = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(1000000): pass
test-stress: os-deps $(STAMP)-test bytecode
	@$(PY) -c 'exec("$(BURN)")' & b1=$$!; \
	$(PY) -c 'exec("$(BURN)")' & b2=$$!; \
	trap 'kill $$b1 $$b2 2>/dev/null' EXIT INT TERM; \
	echo "test-stress: pytest beside two CPU burners (pids $$b1 $$b2)"; \
	$(PYTEST)

bench: $(STAMP)-test,bench
	for f in bench/*_bench.py; do $(PY) $$f || exit 1; done

# Cross-check of the kinematic identification against FIGAROH (bench/figaroh/README.md): its own
# venv, because FIGAROH's Pinocchio stack is large and no cellcal dependency. Never in `make test`.
FIG_VENV := build/figaroh-venv
$(FIG_VENV)/.installed: bench/figaroh/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(FIG_VENV)
	$(FIG_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r bench/figaroh/requirements.txt
	$(FIG_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e .
	touch $@

bench-figaroh: $(FIG_VENV)/.installed
	$(FIG_VENV)/bin/python bench/figaroh/crosscheck.py $(FIGAROH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
