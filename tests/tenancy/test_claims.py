"""System checks of the role model that had no test: tenancy.E010, E011, E015 (issue 9);
E011 to E013 on the worker alias, W019, E020, E021 (the tests review).

Each runs the real check against a real session: a superuser (the cluster's
``postgres`` role, over the local socket) or a database that is not there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core import checks
from django.db import connections

from tenancy.aliases import app_alias, system_alias


@contextmanager
def extra_alias(settings, name: str, **overrides) -> Iterator[str]:
    """A database alias, like the owner's but with ``overrides``, for the test's length."""
    from django.conf import settings as django_settings

    config = {**connections.settings["owner"], **overrides}
    django_settings.DATABASES[name] = config  # in place: overriding DATABASES resets nothing
    connections.settings[name] = config
    try:
        yield name
    finally:
        connections[name].close()
        del connections[name]
        connections.settings.pop(name, None)
        django_settings.DATABASES.pop(name, None)


def superuser_alias(settings):
    db = connections.settings["owner"]
    return extra_alias(settings, "claims_superuser", USER="postgres", PASSWORD="",
                       HOST=os.environ.get("DIO_PGSOCKET") or db["HOST"])


def error_ids(databases: list[str]) -> set[str]:
    return {m.id for m in checks.run_checks(databases=databases) if m.level >= checks.ERROR}


def test_a_superuser_as_the_app_alias_is_refused_with_e011(settings):
    real = app_alias()
    assert "tenancy.E011" not in error_ids([real])
    settings.TENANCY = {**settings.TENANCY, "APP_DATABASE": "claims_superuser"}
    with superuser_alias(settings) as alias:
        assert "tenancy.E011" in error_ids([alias])


def test_a_superuser_as_the_system_alias_is_refused_with_e015(settings):
    assert "tenancy.E015" not in error_ids([system_alias()])
    settings.TENANCY = {**settings.TENANCY, "SYSTEM_DATABASE": "claims_superuser"}
    with superuser_alias(settings) as alias:
        assert "tenancy.E015" in error_ids([alias])


def test_a_database_that_cannot_be_inspected_is_reported_with_e010_not_raised(settings):
    settings.TENANCY = {**settings.TENANCY, "APP_DATABASE": "claims_gone"}
    with extra_alias(settings, "claims_gone", NAME="dio_no_such_database") as alias:
        messages = checks.run_checks(databases=[alias])
    e010 = [m for m in messages if m.id == "tenancy.E010"]
    assert len(e010) == 1 and "dio_no_such_database" in e010[0].msg
    assert "Could not inspect database 'claims_gone'" in e010[0].msg



def test_an_alias_of_no_role_that_cannot_be_inspected_is_reported_once(settings):
    """The owner's alias, say (``check --database owner``): the privilege and temporary-table
    checks both ask it; one E010 says so."""
    with extra_alias(settings, "claims_gone", NAME="dio_no_such_database") as alias:
        messages = checks.run_checks(databases=[alias])
    assert [m.id for m in messages].count("tenancy.E010") == 1

# --- docs/roles.md: E011 to E013 apply to the worker alias too (check --database worker) ---


def test_the_real_worker_alias_passes_the_role_checks():
    from tenancy.aliases import worker_alias

    assert error_ids([worker_alias()]) & {"tenancy.E011", "tenancy.E012", "tenancy.E013"} == set()


def test_a_superuser_as_the_worker_alias_is_refused_with_e011(settings):
    settings.TENANCY = {**settings.TENANCY, "WORKER_DATABASE": "claims_superuser"}
    with superuser_alias(settings) as alias:
        assert "tenancy.E011" in error_ids([alias])


def test_a_bypassrls_role_as_the_worker_alias_is_refused_with_e012(settings):
    settings.TENANCY = {**settings.TENANCY, "WORKER_DATABASE": system_alias()}
    assert "tenancy.E012" in error_ids([system_alias()])  # the system role: BYPASSRLS


def test_the_owner_as_the_worker_alias_is_refused_with_e013(settings):
    settings.TENANCY = {**settings.TENANCY, "WORKER_DATABASE": "owner"}
    assert "tenancy.E013" in error_ids(["owner"])


def test_check_database_worker_runs_them(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.TENANCY = {**settings.TENANCY, "WORKER_DATABASE": "owner"}
    with pytest.raises(SystemCheckError, match="tenancy.E013"):
        call_command("check", "--database", "owner")


# --- docs/roles.md: W019, E020, E021 -----------------------------------------------------


def all_ids() -> set[str]:
    return {m.id for m in checks.run_checks()}


def test_a_worker_alias_missing_from_databases_is_warned_with_w019(settings):
    assert "tenancy.W019" not in all_ids()
    settings.TENANCY = {**settings.TENANCY, "WORKER_DATABASE": "claims_nowhere"}
    assert "tenancy.W019" in all_ids()


@pytest.mark.parametrize("kind", ["WORKER_DATABASE", "SYSTEM_DATABASE"])
def test_the_app_role_as_the_worker_or_system_role_is_refused_with_e020(settings, kind):
    assert "tenancy.E020" not in all_ids()
    settings.TENANCY = {**settings.TENANCY, kind: app_alias()}
    [found] = [m for m in checks.run_checks() if m.id == "tenancy.E020"]
    assert found.level == checks.ERROR
    assert ("worker" if kind == "WORKER_DATABASE" else "system") in found.msg


def test_a_model_routed_away_inside_a_batch_is_refused_with_e021(settings):
    assert "tenancy.E021" not in all_ids()
    settings.DATABASE_ROUTERS = []  # without tenancy.routers.AppDatabaseRouter
    found = [m for m in checks.run_checks() if m.id == "tenancy.E021"]
    assert "testapp.Order" in {m.obj._meta.label for m in found}
    assert all(m.level == checks.ERROR for m in found)
