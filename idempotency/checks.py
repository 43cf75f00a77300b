"""System checks of the idempotency app: its settings, and can every pending key be finished?"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DatabaseError

from django_idempotency_outbox.conf import CheckIds, check
from django_idempotency_outbox.errors import ConfigurationError
from idempotency import phases, store
from idempotency.conf import idempotency_settings
from tenancy.conf import tenancy_settings

#: The ids under which ``IDEMPOTENCY`` is reported (docs/settings.md): a value it
#: cannot take (the dict itself included), a key it does not take (unknown, or
#: removed: the message names what replaces it).
SETTINGS_CHECK_IDS = CheckIds(
    not_a_dict="idempotency.E090", invalid="idempotency.E090",
    unknown="idempotency.E091", removed="idempotency.E091",
)


def register() -> None:
    checks.register(check_settings)
    checks.register(check_pending_programs, checks.Tags.database)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``IDEMPOTENCY``: a dict, known keys, convertible values, no key a release removed."""
    return check(idempotency_settings, SETTINGS_CHECK_IDS)


def check_pending_programs(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A scope with pending keys (phases mode) but no program in this process.

    Asked of the system alias (``check --database system``): it sees every
    tenant's keys. Such keys wait for a program that neither the completer
    nor a retry served by this code can run: a program outside an app's
    ``phases`` module that nothing imported, or one removed or renamed by a
    deploy while requests were under way.
    """
    try:
        alias = tenancy_settings.SYSTEM_DATABASE
    except ConfigurationError:
        return []
    if alias not in (databases or ()) or alias not in settings.DATABASES:
        return []
    try:
        scopes = store.pending_scopes(alias)
    except DatabaseError:
        return []  # tenancy.E010 reports a database that cannot be inspected
    return [
        checks.Warning(
            f"Idempotency keys of scope {scope!r} are pending, but no phases program has "
            "that scope in this process: the completer cannot finish them.",
            hint="Define (or import) the program in an installed app's phases.py, which "
            "is imported at startup (docs/phases.md).",
            id="idempotency.W001",
        )
        for scope in scopes
        if phases.program_for(scope) is None
    ]
