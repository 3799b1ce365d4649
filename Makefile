# The verbs people type. `make run` and `make test` set everything up themselves.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PORT    ?= 8000
HOST    ?= 127.0.0.1
PYTHON  ?= python3
STAMP   := $(VENV)/.installed-stamp

.PHONY: setup run test test-fast test-postgres bench lint fmt clean

# The stamp holds a hash of what the install reads, not a date: a git worktree's fresh checkout is
# newer than a shared venv's stamp, and an mtime rule re-ran `pip install -e .` into that venv
# (pointing its editable install at the worktree). Same content, no install; any edit (or no venv,
# or no stamp: a fresh clone) installs.
INSTALL_INPUTS := requirements.txt requirements-dev.txt pyproject.toml
INSTALL_HASH = cat $(INSTALL_INPUTS) | $(PYTHON) -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"

setup:
	@want=$$($(INSTALL_HASH)) && [ -n "$$want" ] || exit 1; \
	if [ -x $(PY) ] && [ "$$(cat $(STAMP) 2>/dev/null)" = "$$want" ]; then exit 0; fi; \
	set -ex; \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install -q --upgrade pip; \
	$(PY) -m pip install -q -r requirements-dev.txt; \
	$(PY) -m pip install -q --no-deps -e .; \
	echo "$$want" > $(STAMP)

# One machine: SQLite + embedded Redis + web + scheduler + one GPU worker (simulated GPUs where none exist).
run: setup
	$(PY) manage.py migrate --noinput
	$(PY) manage.py demo_setup
	@echo
	@echo "  yoloportal: http://$(HOST):$(PORT)/   (admin: http://$(HOST):$(PORT)/admin/)"
	@echo "  API token:  $(if $(DATA_DIR),DATA_DIR=$(DATA_DIR) )$(PY) manage.py issue_token alice"
	@echo "  The page answers once the web workers below say 'Application startup complete' (up to a minute)."
	@echo "  Ctrl-C stops everything."
	@echo
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH YP_PORT=$(PORT) YP_HOST=$(HOST) METRICS_OPEN=$${METRICS_OPEN:-true} \
	  $(VENV)/bin/honcho start -f Procfile $(if $(REDIS_URL),web scheduler worker notify,)

# Two pytest-xdist workers (TEST_WORKERS), whole files to a worker (--dist loadfile: module
# fixtures and the Slurm cluster stay in one process); each worker has its own DATA_DIR
# (var/test/gwN), database, Redis and ports. On two cores this is ~1.5x one process: live
# tests spend much of their time waiting on heartbeats, grace periods and training.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: setup
	$(PY) -m pytest $(PYTEST_PARALLEL)

# The tests that touch the database, again on PostgreSQL 15: scripts/postgres.sh starts a
# throwaway cluster on port 5433 (as root; installs postgresql-15 if missing). Every unit
# test that uses the database, the fault tests, and the integration tests marked `postgres`
# (locking, claims, transactions, pg_dump); browser tests, pure policy tests, the live
# tests marked `one_database` (worker processes, Redis, checkpoints) and the other live
# tests (whose database statements the unit tests cover) run once, in `make test`, so CI
# stays under 45 minutes.
test-postgres: setup
	url=$$(scripts/postgres.sh start) && DATABASE_URL=$$url ONLY_DATABASE_TESTS=1 \
	  $(PY) -m pytest $(PYTEST_PARALLEL) -m "not browser and not one_database and (not integration or faults or postgres)"

test-fast: setup
	$(PY) -m pytest -m "not integration and not faults and not browser"

# Every benchmark against its baseline from the same run → bench/results.json and the table in
# docs/performance.md (BENCH_ARGS="--quick" for a smoke run, "--only submit,lists" for some).
# Slurm baselines need slurm-wlm (../shared/recipes/slurm-single-node.sh installs it), PostgreSQL
# ones scripts/postgres.sh: both need root. About 40 minutes on an idle 2-core machine.
bench: setup
	$(PY) bench/run_all.py $(BENCH_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

fmt: setup
	$(VENV)/bin/ruff format .

clean:
	rm -rf var/test .pytest_cache
