# django-idempotency-outbox — developer entry points.
#
#   make demo               the example shop, running, with a narrated scenario (make demo-stop)
#   make test               the whole suite on a private PostgreSQL, Redis and RabbitMQ,
#                           started and stopped here, the admin's browser tests in Debian's
#                           Chromium included; as root, a missing Debian package (pgbouncer's
#                           too: the tests start poolers of their own) is installed first
#   make screenshots        the browser tests again, saving the admin's pages the docs
#                           show into docs/img/
#   make test-pooled        the idempotency, tenancy and outbox suites (and the session-state
#                           tests) with every alias through a private pgbouncer in transaction
#                           mode (DIO_POOLED=app,worker,system); tests marked direct_sessions
#                           are skipped there, with their reason
#   make test-app-alias     the same suites with the aliases named other than "default"
#                           (tests/settings_app_alias.py: nothing may assume "default")
#   make test-variants      the tests marked `variants` (what a deployment variant can
#                           change: docs/contributing.md) once more, in every variant at
#                           once: every alias through pgbouncer (as test-pooled), the
#                           aliases named other than default (as test-app-alias), the
#                           verified tenant context (as test-verified); a marked test
#                           that sends no statement through the library's aliases
#                           fails there; CI runs it after make test
#   make test-matrix        tox: the upstream-pinning tests and the contract on the oldest
#                           allowed Django, DRF, psycopg, Celery/kombu (tox.ini; the newest
#                           are make test's own, installed from pyproject.toml's ranges,
#                           and Django 6.0 is test-django60's)
#   make test-django60      tox's django60 environment (Django 6.0) on a Python >= 3.12,
#                           or a plain line saying why it did not run (a failure in CI)
#   make tox-envs           both tox environments made, no test run (CI makes them while
#                           make test runs; then TOX_RECREATE= reuses them)
#   make test-verified      the same suites in the verified tenant context (DIO_VERIFIED_CONTEXT=1:
#                           the key installed and the mode on, docs/roles.md)
#   make dist               sdist and wheel into dist/ (DIST=dir: elsewhere), twine check,
#                           and a check of their contents and version (every sql/*.sql
#                           and py.typed, no tests; the version has a CHANGELOG.md entry)
#   make bench-idempotency  DRF endpoint with and without the mixin, side by side
#   make bench-outbox       relay into Redis and RabbitMQ (Celery), no-op consumer, latency,
#                           memory
#   make bench-reaper       reaping 1,000,000 expired keys under live traffic
#   make bench-idempotency-cpu  CPU per request in-process (no HTTP server), per statement
#   make bench-scale        how the costs grow: 10M keys, the reaper and a day of churn,
#                           1-10,000 tenants publishing, a 1M-message backlog, retention,
#                           ten consumers and one far behind, 200 clients through
#                           pgbouncer; tables and plots into docs/benchmarks.md and
#                           docs/img/scale/ (hours: BENCH_ARGS=--quick for small sizes)
#   make soak               the example shop under load and faults, then its invariants
#                           (ARGS="--duration 600 --seed 1 ..."; BROKER=rabbitmq for
#                           RabbitMQ in place of Redis; see docs/operations.md)
#   make lint               ruff, mypy (strict), the import contract (lint-imports: the
#                           layers of pyproject.toml's [tool.importlinter]) and the
#                           mutant catalogue still matching the code
#   make mutants            the catalogue of claim-breaking edits (mutants/catalogue.py),
#                           each applied in a scratch copy with its tests run; not part of
#                           make test (an hour or more). MUTANTS_ARGS="ID ..." or
#                           "--module outbox.relay" picks some; "--list", "--check"
#   make docs               the documentation site (MkDocs, strict) into site/
#   make services / make services-stop   keep PostgreSQL and Redis up between runs
#                           (scripts/services start pgbouncer adds the pooler)
#   make clean              stop the services, delete .run/ (their data), .venv and dist/
#
# PostgreSQL, Redis, pgbouncer and Chromium come from Debian's packages (apt-get, as root)
# and run from .run/ on 127.0.0.1, each on a port it keeps: see scripts/services.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs
DIST_STAMP := $(VENV)/.installed-dist
BENCH_STAMP := $(VENV)/.installed-bench
TOX_STAMP  := $(VENV)/.installed-tox

.PHONY: soak demo demo-stop test test-pooled dist bench-idempotency bench-outbox bench-reaper bench-idempotency-cpu bench-scale lint docs services services-stop clean

$(STAMP): pyproject.toml
	@echo "[make] creating $(VENV) and installing the project with its test tools"
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -U "pip>=25.1"
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e . --group test --group lint --group demo
	@touch $(STAMP)

test: $(STAMP)
	@scripts/services run pg redis rabbitmq chromium -- $(BIN)/python -m pytest $(PYTEST_ARGS)

# The admin's pages in docs/img/, taken by the browser tests (tests/browser) as they run.
.PHONY: screenshots
screenshots: $(STAMP)
	@DIO_SCREENSHOTS=docs/img scripts/services run pg redis chromium -- \
		$(BIN)/python -m pytest tests/browser $(PYTEST_ARGS)

# Every alias behind the private pgbouncer (transaction pooling): app, worker
# and system, as docs/scaling.md allows; the outage tests included (the
# pooler's server_login_retry and query_wait_timeout, scripts/services).
test-pooled: $(STAMP)
	@DIO_POOLED=app,worker,system scripts/services run pg redis rabbitmq pgbouncer -- \
		$(BIN)/python -m pytest tests/idempotency tests/tenancy tests/outbox \
		tests/test_session_state.py $(PYTEST_ARGS)

# The tenancy, idempotency and outbox suites again, with the app alias named "app" and the
# system alias "upkeep" (tests/settings_app_alias.py): nothing may assume "default".
.PHONY: test-app-alias
test-app-alias: $(STAMP)
	@DJANGO_SETTINGS_MODULE=tests.settings_app_alias \
		scripts/services run pg redis rabbitmq -- $(BIN)/python -m pytest tests/tenancy tests/idempotency tests/outbox $(PYTEST_ARGS)

# Every deployment variant in one pass: every alias behind pgbouncer, the aliases renamed
# (tests/settings_app_alias.py) and the verified tenant context, for the tests marked
# `variants`: those whose outcome a variant can change (docs/contributing.md says which).
# --check-variants fails a marked test that sends no statement through the library's
# aliases (tests/variants_check.py). Each variant's own target stays for a run of its own
# (whole suites); CI runs this one after make test. scripts/ci-count uses the same settings.
.PHONY: test-variants
test-variants: $(STAMP)
	@DIO_POOLED=app,worker,system DIO_VERIFIED_CONTEXT=1 DJANGO_SETTINGS_MODULE=tests.settings_app_alias \
		scripts/services run pg redis rabbitmq pgbouncer -- \
		$(BIN)/python -m pytest -m variants --check-variants $(PYTEST_ARGS)

# The version matrix (tox.ini): the tests that pin other projects' behaviour, and the
# contract, on the oldest Django 5.2.x, DRF, psycopg 3.x and Celery/kombu 5.x that
# pyproject.toml allows (tests/upstream/oldest.txt). The newest are make test's own:
# its virtualenv installs them from pyproject.toml's ranges (tox -e newest runs them
# apart); Django 6.0 is make test-django60's.
# In CI (CI set, as .ci/run sets it) an environment whose Python is missing fails
# rather than being skipped: a step that cannot run must not pass.
TOX_STRICT := $(if $(CI),--skip-missing-interpreters false)

# TOX_RECREATE= reuses an environment made by `make tox-envs` (CI makes them beside make test).
TOX_RECREATE ?= --recreate

.PHONY: test-matrix
test-matrix: $(TOX_STAMP)
	@$(BIN)/tox $(TOX_RECREATE) -e oldest $(TOX_STRICT) $(TOX_ARGS)

# Django 6.0 (tox's django60 environment) needs Python >= 3.12: the first one found
# on the path (python3.14 ... python3.12), else one pyenv has installed. Without any,
# it says plainly that the environment did not run, and why: a failure in CI (CI set),
# a success elsewhere.
.PHONY: test-django60
test-django60: $(TOX_STAMP)
	@py=$$(scripts/find-python 3.12); \
	if [ -z "$$py" ]; then \
		echo "[make] test-django60: the django60 environment did NOT run: no Python >= 3.12 was found (on the path: $$($(PYTHON) --version 2>&1); pyenv: $$(ls "$${PYENV_ROOT:-$$HOME/.pyenv}/versions" 2>/dev/null | tr '\n' ' ')). Django 6.0 needs Python 3.12."; \
		if [ -n "$(CI)" ]; then echo "[make] test-django60: failing: CI is set, and CI must not pass without it"; exit 1; fi; \
	else \
		echo "[make] test-django60: Django 6.0 on $$($$py --version) ($$py)"; \
		$(BIN)/tox -e django60 --discover "$$py" $(TOX_STRICT) $(TOX_ARGS); \
	fi

# The two environments above made and their packages installed, no test run: pip's work,
# which needs no service (.ci/run runs it beside make test, then both targets with
# TOX_RECREATE=). A missing Python >= 3.12 fails here as in test-django60, in CI.
.PHONY: tox-envs
tox-envs: $(TOX_STAMP)
	@$(BIN)/tox --notest --recreate -e oldest $(TOX_STRICT)
	@py=$$(scripts/find-python 3.12); \
	if [ -z "$$py" ]; then \
		echo "[make] tox-envs: the django60 environment was NOT made: no Python >= 3.12 was found"; \
		if [ -n "$(CI)" ]; then exit 1; fi; \
	else \
		$(BIN)/tox --notest --recreate -e django60 --discover "$$py" $(TOX_STRICT); \
	fi

$(TOX_STAMP): $(STAMP)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --group tox
	@touch $(TOX_STAMP)
# The tenancy, idempotency and outbox suites again, with the database in the verified
# tenant context and the web side minting tokens (tests/settings.py, tests/dbsetup.py).
.PHONY: test-verified
test-verified: $(STAMP)
	@DIO_VERIFIED_CONTEXT=1 \
		scripts/services run pg redis rabbitmq -- $(BIN)/python -m pytest tests/tenancy tests/idempotency tests/outbox $(PYTEST_ARGS)

bench-idempotency: $(STAMP)
	@scripts/services run pg -- $(BIN)/python bench/bench_idempotency.py $(BENCH_ARGS)

bench-outbox: $(STAMP)
	@scripts/services run pg redis rabbitmq -- $(BIN)/python bench/bench_outbox.py $(BENCH_ARGS)

bench-reaper: $(STAMP)
	@scripts/services run pg -- $(BIN)/python bench/bench_reaper.py $(BENCH_ARGS)

bench-idempotency-cpu: $(STAMP)
	@scripts/services run pg -- $(BIN)/python bench/cpu_idempotency.py $(BENCH_ARGS)

# The bench tools (matplotlib, for the plots) live in their own group and stamp,
# so `make test` stays lean.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	@echo "[make] installing the bench tools (dependency group 'bench') into $(VENV)"
	@$(BIN)/python -m pip install -q --disable-pip-version-check --group bench
	@touch $(BENCH_STAMP)

bench-scale: $(BENCH_STAMP)
	@scripts/services run pg redis pgbouncer -- $(BIN)/python bench/bench_scale.py $(BENCH_ARGS)

# A fault-injection soak of the example shop: 10 minutes unless ARGS says otherwise;
# BROKER=rabbitmq runs it on RabbitMQ (default redis).
BROKER ?= redis
soak: $(STAMP)
	@scripts/services run pg redis $(filter rabbitmq,$(BROKER)) -- $(BIN)/python -m example_project.soak --broker $(BROKER) $(ARGS)

demo: $(STAMP)
	@scripts/demo up

demo-stop:
	@scripts/demo down

# Not part of `make test`: each mutant runs its named tests (docs/contributing.md).
.PHONY: mutants
mutants: $(STAMP)
	@scripts/services run pg redis rabbitmq -- $(BIN)/python -m mutants.run $(MUTANTS_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check idempotency tenancy outbox django_idempotency_outbox tests bench mutants
	$(BIN)/mypy idempotency tenancy outbox django_idempotency_outbox
	$(BIN)/lint-imports
	$(BIN)/python -m mutants.run --check

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
$(DIST_STAMP): $(STAMP) pyproject.toml
	@echo "[make] installing the packaging tools (dependency group 'dist') into $(VENV)"
	@$(BIN)/python -m pip install -q --disable-pip-version-check --group dist
	@touch $(DIST_STAMP)

# tests/test_getting_started.py builds its wheel with `make dist DIST=<a directory of its own>`.
DIST ?= dist
dist: $(DIST_STAMP)
	@rm -rf $(DIST) build
	@$(BIN)/python -m build --outdir $(DIST) . >$(VENV)/build.log 2>&1 \
		|| { tail -n 30 $(VENV)/build.log; echo "[make] python -m build failed; see $(VENV)/build.log"; exit 1; }
	@$(BIN)/twine check --strict $(DIST)/*
	@$(BIN)/python scripts/check-dist $(DIST)/*.whl $(DIST)/*.tar.gz

services:
	@scripts/services start pg redis

services-stop:
	@scripts/services stop

clean:
	@scripts/services clean
	rm -rf $(VENV) *.egg-info dist build
