# The two commands a newcomer needs: `make run` (a single-node broker) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test run bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

run: $(STAMP)
	$(VENV)/bin/rivven-broker

bench: $(STAMP)
	$(PY) -m rivven_broker.bench storage

clean:
	rm -rf $(VENV) build *.egg-info
