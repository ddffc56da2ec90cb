# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-install when pyproject.toml changes; the install is editable so code edits need nothing.
$(STAMP)-%: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[$*]"
	touch $@

# The simulated cell end to end: sim robot (RTDE) + sim tracker + daemon, a full
# base-frame calibration, the report and one drift check.
demo: $(STAMP)-test
	$(VENV)/bin/cellcal demo

test: $(STAMP)-test
	$(PY) -m pytest -q

bench: $(STAMP)-test,bench
	for f in bench/*_bench.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
