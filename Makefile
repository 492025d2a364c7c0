# Everything is installed into .venv/. `make run` and `make test` work on a fresh
# machine that has Python 3.11+ and apt (for MariaDB when ORBIT_MYSQL_DSN is unset).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
CREDENTIALS ?= $(CURDIR)/var/dev.credentials.json
export ORBIT_HTTP_ADDR ?= 127.0.0.1:8080
# Python keeps the bytecode of the repository's modules, and pytest its rewritten tests,
# under __pycache__/ (ignored by git). Where the environment sets PYTHONDONTWRITEBYTECODE,
# every process the suite starts (nodes, orbit-admin, Workers, examples) and every test
# process would compile the project from source again: orbit-admin took 0.6 s to start
# instead of 0.4, and collecting the tests 9 s instead of 3.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install db browser redis run lint test unit integration system repository bench clean

# The repository's three distributions, editable: the wire contract (protocol/), the SDK
# (sdk/) and the node (here), which depends on both.
EDITABLE := -e ./protocol -e ./sdk

$(STAMP): pyproject.toml sdk/pyproject.toml protocol/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(EDITABLE) -e '.[test]'
	@# A venv made before the SDK had its own distribution: replacing the old orbit-node
	@# removes the orbit-worker script it owned, after the SDK wrote its own.
	test -x $(BIN)/orbit-worker || $(BIN)/pip install --quiet --no-deps --force-reinstall -e ./sdk
	touch $(STAMP)

install: $(STAMP)

# Start the private MariaDB under ./var unless ORBIT_MYSQL_DSN points elsewhere.
db:
	@if [ -z "$$ORBIT_MYSQL_DSN" ]; then scripts/devdb.sh start >/dev/null; fi

# The credentials file is written beside the node, once the node answers /readyz and
# accepts its token (bootstrap --when-ready): a node that fails to start leaves an
# existing file as it was. scripts/run.sh runs both and waits for both; when the node
# stops it says that the private MariaDB is still running (see README.md).
READY_WAIT_S ?= 600
run: install db
	@BIN="$(abspath $(BIN))" CREDENTIALS="$(abspath $(CREDENTIALS))" READY_WAIT_S="$(READY_WAIT_S)" exec scripts/run.sh

# Lint, format check, type check and the import contracts (configuration in pyproject.toml);
# `make test` runs it first.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The console's browser tests drive headless Chromium through chromedriver: Debian's
# chromium and chromium-driver packages, installed with apt when missing (like MariaDB).
browser:
	@if [ ! -x /usr/bin/chromedriver ] || [ ! -x /usr/bin/chromium ]; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "error: the console's browser tests need /usr/bin/chromium and /usr/bin/chromedriver" >&2; exit 1; fi; \
	  echo "chromedriver not found: installing the Debian chromium and chromium-driver packages" >&2; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

# Tests create and drop their own databases on the server of ORBIT_TEST_MYSQL_DSN, in
# TEST_WORKERS processes side by side (pytest-xdist; worksteal hands a long test's neighbours
# to idle workers). Most tests wait on a socket, a database or a child process, so three
# processes keep two cores busy. The 15 slowest tests are printed at the end.
TEST_WORKERS ?= 3
PYTEST := $(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal --durations=15
# The test database server: ORBIT_MYSQL_DSN's when it is set, else the private one (`make db`).
TEST_DSN := ORBIT_TEST_MYSQL_DSN="$${ORBIT_MYSQL_DSN:-$$(scripts/devdb.sh dsn)}"

# Every kind of test (tests/unit, integration, system, repository), after the lint.
test: install db browser lint
	@$(TEST_DSN) $(PYTEST) $(PYTEST_ARGS)

# One kind at a time. tests/unit needs no database, no browser and no lint: its runs
# have no test server to reach (ORBIT_TEST_MYSQL_DSN is removed), so a unit test that
# asked for one would fail. Only tests/system holds the browser tests, so only it (and
# `make test`) installs Chromium.
unit: install
	@env -u ORBIT_TEST_MYSQL_DSN $(PYTEST) tests/unit $(PYTEST_ARGS)

integration repository: install db
	@$(TEST_DSN) $(PYTEST) tests/$@ $(PYTEST_ARGS)

system: install db browser
	@$(TEST_DSN) $(PYTEST) tests/system $(PYTEST_ARGS)

# The benchmarks' Redis peers (Celery, Dramatiq) run on private redis-server processes the
# bench starts itself (bench/redisserver.py): Debian's redis-server package, installed with apt
# when missing (like MariaDB and Chromium).
redis:
	@if [ ! -x /usr/bin/redis-server ]; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "error: the benchmarks' Redis peers need /usr/bin/redis-server" >&2; exit 1; fi; \
	  echo "redis-server not found: installing the Debian redis-server package" >&2; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null; \
	fi

# Benchmark extras (plots, histograms, profiler, peers) only for `make bench`.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet $(EDITABLE) -e '.[test,bench]'
	touch $(BENCH_STAMP)

# `make bench` runs every scenario; `make bench SCENARIO=burn-down BENCH_ARGS='--tasks 2000'` one of them.
# Each runs at production durability (and the development setting beside it where it prints a
# column each) on private mariadbd servers it starts itself (bench/durability.py); only
# `--durability server` uses ORBIT_BENCH_MYSQL_DSN (default: the development server, `make db`).
# Results (JSON, PNG) go to bench/results/.
bench: $(BENCH_STAMP) redis
	$(BIN)/python -m bench $(or $(SCENARIO),all) $(BENCH_ARGS)

clean:
	-scripts/devdb.sh stop
	rm -rf $(VENV) var
