"""What in the process's environment changes how the aliases log in.

libpq takes a password from ``PGPASSWORD`` before it looks in a password file.
An exported ``PGPASSWORD`` (a superuser's, kept from ``create_roles``) is
therefore tried for every alias whose password is in its password file
(``databases(..., passfile=...)``), and each of them fails with "password
authentication failed" and nothing else to go on: ``tenancy.W049`` says why.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import checks


def check_pgpassword(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``tenancy.W049``: ``PGPASSWORD`` is set and the aliases checked expect their password file.

    A database check (``check --database``, ``migrate``): where the logins fail.
    ``create_roles``, which is given the superuser's password that way, checks no
    database.
    """
    if not os.environ.get("PGPASSWORD"):
        return []
    shadowed = sorted(
        alias for alias in databases or () if alias in settings.DATABASES
        and (settings.DATABASES[alias].get("OPTIONS") or {}).get("passfile")
        and not settings.DATABASES[alias].get("PASSWORD")
    )
    if not shadowed:
        return []
    return [checks.Warning(
        f"PGPASSWORD is set in the environment: libpq uses it before the password file, so "
        f"the aliases {', '.join(shadowed)} log in with it, not with their own passwords "
        "(\"password authentication failed\").",
        hint="unset PGPASSWORD; give create_roles the superuser's password for that one "
        "command only: PGPASSWORD=... python manage.py create_roles",
        id="tenancy.W049",
    )]


def register() -> None:
    """Called by ``TenancyConfig.ready()``."""
    checks.register(check_pgpassword, checks.Tags.database)
