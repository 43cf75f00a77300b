"""System checks of the role model that had no test (issue 9): tenancy.E010, E011, E015.

Each runs the real check against a real session: a superuser (the cluster's
``postgres`` role, over the local socket) or a database that is not there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

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
