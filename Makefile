# django-idempotency-outbox — developer entry points.
#
#   make demo               the example shop, running, with a narrated scenario (make demo-stop)
#   make test               the whole suite on a private PostgreSQL (started and stopped here)
#   make test-pooled        the idempotency, tenancy and outbox suites with the app alias
#                           through a private pgbouncer in transaction mode (DIO_POOLED=app);
#                           tests marked direct_sessions are skipped there, with their reason
#   make test-app-alias     the same suites with the aliases named other than "default"
#                           (tests/settings_app_alias.py: nothing may assume "default")
#   make test-verified      the same suites in the verified tenant context (DIO_VERIFIED_CONTEXT=1:
#                           the key installed and the mode on, docs/roles.md)
#   make dist               sdist and wheel into dist/, twine check, and a check of the
#                           wheel's contents (every sql/*.sql and py.typed; no tests)
#   make bench-idempotency  DRF endpoint with and without the mixin, side by side
#   make bench-outbox       relay into Redis/Celery, no-op consumer, latency, memory
#   make bench-reaper       reaping 1,000,000 expired keys under live traffic
#   make lint               ruff and mypy
#   make docs               the documentation site (MkDocs, strict) into site/
#   make services / make services-stop   keep PostgreSQL and Redis up between runs
#                           (scripts/services start pgbouncer adds the pooler)
#   make clean              stop the services, delete .run/ (their data), .venv and dist/
#
# PostgreSQL, Redis and pgbouncer come from Debian's packages (apt-get, as root)
# and run from .run/ on 127.0.0.1, each on a port it keeps: see scripts/services.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs
DIST_STAMP := $(VENV)/.installed-dist

.PHONY: demo demo-stop test test-pooled dist bench-idempotency bench-outbox bench-reaper lint docs services services-stop clean

$(STAMP): pyproject.toml
	@echo "[make] creating $(VENV) and installing the project with its test tools"
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -U "pip>=25.1"
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e . --group test --group lint --group demo
	@touch $(STAMP)

test: $(STAMP)
	@scripts/services run pg redis -- $(BIN)/python -m pytest $(PYTEST_ARGS)

# The system alias stays direct: the key reaper's single-instance lock is a
# session-level advisory lock (docs/scaling.md). DIO_POOLED=app,system also works.
test-pooled: $(STAMP)
	@DIO_POOLED=app scripts/services run pg redis pgbouncer -- \
		$(BIN)/python -m pytest tests/idempotency tests/tenancy tests/outbox $(PYTEST_ARGS)

# The tenancy, idempotency and outbox suites again, with the app alias named "app" and the
# system alias "upkeep" (tests/settings_app_alias.py): nothing may assume "default".
.PHONY: test-app-alias
test-app-alias: $(STAMP)
	@DJANGO_SETTINGS_MODULE=tests.settings_app_alias \
		scripts/services run pg redis -- $(BIN)/python -m pytest tests/tenancy tests/idempotency tests/outbox $(PYTEST_ARGS)

# The tenancy, idempotency and outbox suites again, with the database in the verified
# tenant context and the web side minting tokens (tests/settings.py, tests/dbsetup.py).
.PHONY: test-verified
test-verified: $(STAMP)
	@DIO_VERIFIED_CONTEXT=1 \
		scripts/services run pg redis -- $(BIN)/python -m pytest tests/tenancy tests/idempotency tests/outbox $(PYTEST_ARGS)

bench-idempotency: $(STAMP)
	@scripts/services run pg -- $(BIN)/python bench/bench_idempotency.py $(BENCH_ARGS)

bench-outbox: $(STAMP)
	@scripts/services run pg redis -- $(BIN)/python bench/bench_outbox.py $(BENCH_ARGS)

bench-reaper: $(STAMP)
	@scripts/services run pg -- $(BIN)/python bench/bench_reaper.py $(BENCH_ARGS)

demo: $(STAMP)
	@scripts/demo up

demo-stop:
	@scripts/demo down

lint: $(STAMP)
	$(BIN)/ruff check idempotency tenancy outbox django_idempotency_outbox tests bench
	$(BIN)/mypy idempotency tenancy outbox django_idempotency_outbox

# The docs tools live in their own group and stamp, so `make test` stays lean.
$(DOCS_STAMP): pyproject.toml
	@echo "[make] installing the docs tools (dependency group 'docs') into $(VENV)"
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -U "pip>=25.1"
	@$(BIN)/python -m pip install -q --disable-pip-version-check --group docs
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean --site-dir site

# The packaging tools live in their own group and stamp, like the docs tools.
$(DIST_STAMP): pyproject.toml
	@echo "[make] installing the packaging tools (dependency group 'dist') into $(VENV)"
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -U "pip>=25.1"
	@$(BIN)/python -m pip install -q --disable-pip-version-check --group dist
	@touch $(DIST_STAMP)

dist: $(DIST_STAMP)
	@rm -rf dist
	@$(BIN)/python -m build --outdir dist . >$(VENV)/build.log 2>&1 \
		|| { tail -n 30 $(VENV)/build.log; echo "[make] python -m build failed; see $(VENV)/build.log"; exit 1; }
	@$(BIN)/twine check --strict dist/*
	@$(BIN)/python scripts/check-dist dist/*.whl dist/*.tar.gz

services:
	@scripts/services start pg redis

services-stop:
	@scripts/services stop

clean:
	@scripts/services clean
	rm -rf $(VENV) *.egg-info dist build
