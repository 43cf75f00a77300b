"""``tenancy.databases()``: the four aliases from one database URL."""

from __future__ import annotations

import pytest

from tenancy import databases
from tenancy.layout import DatabaseURLError


def test_one_url_gives_the_four_aliases_each_as_its_own_role():
    found = databases("postgres://db.internal:6543/shop?sslmode=require",
                      passfile="/etc/shop/pgpass")
    assert list(found) == ["default", "worker", "system", "owner"]
    assert {alias: entry["USER"] for alias, entry in found.items()} == {
        "default": "shop_app", "worker": "shop_worker", "system": "shop_system",
        "owner": "shop_owner",
    }
    for entry in found.values():
        assert (entry["NAME"], entry["HOST"], entry["PORT"]) == ("shop", "db.internal", "6543")
        assert entry["OPTIONS"] == {"sslmode": "require", "passfile": "/etc/shop/pgpass"}
        assert "PASSWORD" not in entry
    assert found["owner"]["ENGINE"] == "django.db.backends.postgresql"
    assert found["owner"]["TEST"] == {"DEPENDENCIES": []}
    for alias in ("default", "worker", "system"):
        assert found[alias]["ENGINE"] == "tenancy.backends.postgresql"
        assert found[alias]["TEST"] == {"DEPENDENCIES": [], "OWNER": "owner"}


def test_what_django_environ_returns_is_accepted_too():
    environ = pytest.importorskip("environ")
    parsed = environ.Env.db_url_config("postgresql://localhost:5432/shop")
    assert databases(parsed) == databases("postgres://localhost:5432/shop")


def test_role_names_and_aliases_can_be_given():
    found = databases("postgres://localhost/shop", roles={"app": "web", "owner": "ddl"},
                      aliases={"app": "app", "system": "upkeep"})
    assert found["default"] == {}  # Django requires it; a query sent there fails at once
    assert {alias: entry.get("USER") for alias, entry in found.items()} == {
        "default": None, "app": "web", "worker": "shop_worker", "upkeep": "shop_system",
        "owner": "ddl",
    }
    assert found["app"]["TEST"]["OWNER"] == "owner"


def test_a_socket_directory_and_an_ipv6_address():
    assert databases("postgresql://%2Fvar%2Frun%2Fpostgresql/shop")["owner"]["HOST"] == (
        "/var/run/postgresql")
    assert databases("postgres://[::1]:5433/shop")["owner"]["HOST"] == "::1"


@pytest.mark.parametrize("url, message", [
    ("postgres://shop_app:secret@localhost/shop", "names a user or a password"),
    ("postgres://localhost:5432/", "names no database"),
    ("mysql://localhost/shop", "expected a postgres:// URL"),
    ({"ENGINE": "django.db.backends.mysql", "NAME": "shop"}, "not PostgreSQL"),
    ({"NAME": "shop", "USER": "shop_app"}, "names a user or a password"),
    (42, "expected a URL or a dict"),
])
def test_a_url_that_cannot_name_the_aliases_is_refused(url, message):
    with pytest.raises(DatabaseURLError, match=message):
        databases(url)


def test_secrets_in_a_refused_url_are_not_repeated():
    with pytest.raises(DatabaseURLError) as caught:
        databases("postgres://shop_app:hunter2@localhost/shop")
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"roles": {"web": "x"}}, "unknown role kind"),
    ({"roles": {"app": "shop_owner"}}, "a role of its own"),
    ({"aliases": {"worker": "system"}}, "an alias of its own"),
    ({"aliases": {"owner": "default", "app": "app"}}, "must not be 'default'"),
])
def test_roles_and_aliases_must_be_distinct_and_known(kwargs, message):
    with pytest.raises(DatabaseURLError, match=message):
        databases("postgres://localhost/shop", **kwargs)
