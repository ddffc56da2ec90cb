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

demo: $(STAMP)-test
	$(VENV)/bin/cellcal demo

test: $(STAMP)-test
	$(PY) -m pytest -q

bench: $(STAMP)-test,bench
	$(PY) bench/solver_bench.py

clean:
	rm -rf $(VENV) build *.egg-info
