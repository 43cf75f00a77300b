# django-idempotency-outbox — developer entry points.
#
#   make demo               the example shop, running, with a narrated scenario (make demo-stop)
#   make test               the whole suite on a private PostgreSQL (started and stopped here)
#   make bench-idempotency  DRF endpoint with and without the mixin, side by side
#   make bench-outbox       relay into Redis/Celery, no-op consumer, latency, memory
#   make bench-reaper       reaping 1,000,000 expired keys under live traffic
#   make lint               ruff and mypy
#   make docs               the documentation site (MkDocs, strict) into site/
#   make services / make services-stop   keep PostgreSQL and Redis up between runs

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: demo demo-stop test bench-idempotency bench-outbox bench-reaper lint docs services services-stop clean

$(STAMP): pyproject.toml
	@echo "[make] creating $(VENV) and installing the project with its test tools"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -U "pip>=25.1"
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e . --group test --group lint --group demo
	@touch $(STAMP)

test: $(STAMP)
	@scripts/services run pg redis -- $(BIN)/python -m pytest $(PYTEST_ARGS)

# The tenancy, idempotency and outbox suites again, with the app alias named "app" and the
# system alias "upkeep" (tests/settings_app_alias.py): nothing may assume "default".
.PHONY: test-app-alias
test-app-alias: $(STAMP)
	@DJANGO_SETTINGS_MODULE=tests.settings_app_alias DIO_SUITE_SETTINGS=tests.settings_app_alias \
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
	$(BIN)/ruff check idempotency tenancy outbox tests bench
	$(BIN)/mypy idempotency tenancy outbox

# The docs tools live in their own group and stamp, so `make test` stays lean.
$(DOCS_STAMP): pyproject.toml
	@echo "[make] installing the docs tools (dependency group 'docs') into $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -U "pip>=25.1"
	@$(BIN)/python -m pip install -q --disable-pip-version-check --group docs
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean --site-dir site

services:
	@scripts/services start pg redis

services-stop:
	@scripts/services stop

clean: services-stop
	rm -rf .run $(VENV) *.egg-info
