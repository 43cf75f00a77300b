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


@pytest.mark.parametrize("query", [
    "password=hunter2", "user=shop_owner", "dbname=other", "host=evil.example", "port=6543",
    "hostaddr=10.0.0.1", "service=prod", "passfile=/tmp/p", "assume_role=shop_owner",
    "options=-c%20role%3Dshop_owner", "sslmode=require&PASSWORD=hunter2",
])
@pytest.mark.parametrize("where", ["url", "pooled"])
def test_credentials_and_targets_in_the_query_string_are_refused_as_in_the_address(query, where):
    """Issue 29, item 8: the same as the netloc refuses (a user, a password), and where the
    address and roles=... say the rest (host, port, database, a role to assume, a service)."""
    url = f"postgres://localhost:5432/shop?{query}"
    with pytest.raises(DatabaseURLError, match="are not options") as caught:
        if where == "url":
            databases(url)
        else:
            databases("postgres://localhost:5432/shop", pooled=url)
    assert "hunter2" not in str(caught.value)


def test_harmless_options_in_the_query_string_are_kept():
    found = databases("postgres://localhost/shop?sslmode=require&connect_timeout=5"
                      "&application_name=shop")
    assert found["default"]["OPTIONS"] == {"sslmode": "require", "connect_timeout": "5",
                                           "application_name": "shop"}


def test_a_name_postgresql_would_cut_is_refused():
    with pytest.raises(DatabaseURLError, match="over 63 bytes"):
        databases("postgres://localhost/" + "d" * 64)
    with pytest.raises(DatabaseURLError, match="over 63 bytes"):
        databases("postgres://localhost/" + "d" * 58)  # d..._worker, 65 bytes
    with pytest.raises(DatabaseURLError, match="over 63 bytes"):
        databases("postgres://localhost/shop", roles={"app": "é" * 32})
    assert databases("postgres://localhost/" + "d" * 56)["worker"]["USER"] == "d" * 56 + "_worker"


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
