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

# Until the daemon lands: a seeded synthetic calibration through `cellcal solve`.
demo: $(STAMP)-test
	$(VENV)/bin/cellcal solve --synthetic 20 --noise-mm 0.2 --noise-deg 0.1

test: $(STAMP)-test
	$(PY) -m pytest -q

bench: $(STAMP)-test,bench
	for f in bench/*_bench.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
