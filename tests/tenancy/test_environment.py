"""An exported PGPASSWORD shadows the aliases' password file: check says so (tenancy.W049).

tests/test_getting_started.py shows it where a reader meets it: ``check`` after an
``export PGPASSWORD``.
"""

from __future__ import annotations

import pytest

from tenancy.environment import check_pgpassword

pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


@pytest.fixture
def passfile_aliases(settings, tmp_path):
    """The aliases as databases(..., passfile=...) writes them: no PASSWORD, a password file."""
    passfile = tmp_path / ".pgpass"
    settings.DATABASES = {
        alias: {**db, "PASSWORD": "", "OPTIONS": {**db.get("OPTIONS", {}),
                                                  "passfile": str(passfile)}}
        for alias, db in settings.DATABASES.items()
    }
    return passfile


def test_an_exported_pgpassword_is_named_with_the_aliases_it_shadows(passfile_aliases,
                                                                     monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "the superuser's")
    assert check_pgpassword() == []  # no database checked (create_roles is given it so)
    [warning] = check_pgpassword(databases=["default", "owner", "system", "worker"])
    assert warning.id == "tenancy.W049"
    assert "default, owner, system, worker" in warning.msg
    assert "unset PGPASSWORD" in warning.hint


def test_nothing_to_say_without_it_or_without_a_password_file(passfile_aliases, monkeypatch,
                                                              settings):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    assert check_pgpassword(databases=["default"]) == []
    monkeypatch.setenv("PGPASSWORD", "x")
    settings.DATABASES = {alias: {**db, "PASSWORD": "its own"}
                          for alias, db in settings.DATABASES.items()}
    assert check_pgpassword(databases=["default"]) == []
