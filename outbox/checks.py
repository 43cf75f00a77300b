"""System checks of the outbox (each id is in docs/operations.md's table), by family:

- its settings (``outbox.E090``, ``E091``): ``OUTBOX`` itself, a removed key
  named with what replaces it;
- the fence (``E001``, ``E002``, ``check --database``): the ids' sequence and the
  trigger that marks publishers, which the database could be talked out of;
- ``I130`` (advice): the system or admin alias's role cannot see how long a
  publisher holding delivery back has been open;
- ``W003`` (``check --deploy --database``): the server lets any role, the web
  role too, leave a prepared transaction that holds delivery back;
- the relay's RabbitMQ (``E110``-``E112``, :func:`outbox.celery.check_broker`):
  errors, since the relay's own promise is at stake and it does not start;
- the Django tasks transport (``E120``, ``W121``, :mod:`outbox.django_tasks`);
- the Celery receivers (``W100``-``W105``, :func:`outbox.celery.check_app`):
  warnings, since a worker is configured apart and logs its own when it starts.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DatabaseError
from django.utils.module_loading import import_string

from django_idempotency_outbox.conf import CheckIds, check
from django_idempotency_outbox.errors import ConfigurationError
from outbox import store
from outbox.conf import outbox_settings

#: The ids under which ``OUTBOX`` is reported (docs/settings.md): a value it
#: cannot take (the dict itself included), a key it does not take (unknown, or
#: removed: the message names what replaces it).
SETTINGS_CHECK_IDS = CheckIds(
    not_a_dict="outbox.E090", invalid="outbox.E090", unknown="outbox.E091", removed="outbox.E091",
)


def register() -> None:
    checks.register(check_settings)
    checks.register(check_fence, checks.Tags.database)
    checks.register(check_stats_privilege, checks.Tags.database)
    checks.register(check_prepared_transactions, checks.Tags.database, deploy=True)
    checks.register(check_receivers)
    checks.register(check_relay_broker)
    checks.register(check_tasks_transport)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``OUTBOX``: a dict, known keys, convertible values, no key a release removed."""
    return check(outbox_settings, SETTINGS_CHECK_IDS)


def _postgresql(databases: Sequence[str] | None) -> list[str]:
    """The aliases of ``databases`` on PostgreSQL (tenancy.E005 reports the others)."""
    return [alias for alias in databases or () if "postgresql" in
            settings.DATABASES.get(alias, {}).get("ENGINE", "")]


def check_fence(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for alias in _postgresql(databases):
        try:
            facts = store.fence_facts(alias)
        except DatabaseError:
            continue  # not migrated yet (tenancy.E010 reports a database it cannot inspect)
        if facts is None:
            continue  # before the outbox's migration 0003
        cache, increment, cycle = facts.cache, facts.increment, facts.cycle
        if cache != 1 or increment <= 0 or cycle:
            errors.append(checks.Error(
                f"Database {alias!r}: the sequence outbox_message_ids has CACHE {cache}, "
                f"INCREMENT {increment}, {'CYCLE' if cycle else 'NO CYCLE'}: ids would not "
                "increase across sessions, and readers could skip messages committed late.",
                hint="ALTER SEQUENCE outbox_message_ids CACHE 1 INCREMENT 1 NO CYCLE; "
                "(docs/guarantees.md).",
                id="outbox.E001"))
        if not facts.marker_exists:
            continue  # before the outbox's migration 0008 (migrate says so)
        if facts.marking not in ("O", "A") or facts.id_default is not None:
            found = ("no trigger marks publishers" if facts.marking is None
                     else f"the marking trigger is disabled (tgenabled {facts.marking!r})"
                     if facts.marking not in ("O", "A")
                     else f"outbox_messages.id has the default {facts.id_default!r}")
            errors.append(checks.Error(
                f"Database {alias!r}: {found}. Each new message must take its id from "
                "the trigger outbox_messages_mark_publisher (outbox_mark_publisher_v2()), "
                "which marks its transaction as a publisher in flight; without it, "
                "readers could skip messages committed late.",
                hint="ALTER TABLE outbox_messages ENABLE TRIGGER "
                "outbox_messages_mark_publisher; ALTER TABLE outbox_messages ALTER COLUMN "
                "id DROP DEFAULT; (docs/guarantees.md).",
                id="outbox.E002"))
    return errors


def check_stats_privilege(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """outbox.I130: the system (or admin) alias cannot see how long a holder has been open.

    Advice (an Info), not a warning: the grant is optional, and a deploy that
    checks with ``--fail-level WARNING`` should not fail for want of it.
    """
    from outbox.observation import powers
    from tenancy.aliases import admin_alias, system_alias

    warnings: list[checks.CheckMessage] = []
    try:
        readers = {system_alias(), admin_alias()}
    except Exception:  # an alias not configured: tenancy's checks report it
        return warnings
    for alias in sorted(readers.intersection(databases or ())):
        try:
            seen = powers(alias)
        except DatabaseError:
            continue
        if not seen.reads_all_stats:
            warnings.append(checks.Info(
                f"Database {alias!r}: the role {seen.role} is not a member of pg_read_all_stats: "
                "outbox_status, outbox_health and dio_outbox_blocker_age_seconds cannot see how "
                "long a transaction that holds delivery back has been open, nor its query.",
                hint=f"As a superuser: GRANT pg_read_all_stats TO {seen.role}; "
                "(docs/operations.md).",
                id="outbox.I130",
            ))
    return warnings


def check_prepared_transactions(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``outbox.W003``: the server lets any role ``PREPARE TRANSACTION``.

    PostgreSQL has no privilege for two-phase commit: with
    ``max_prepared_transactions`` above 0 every role may prepare, and a
    prepared transaction that published holds its tenants' delivery until
    someone ends it (health reports it after ``HEALTH_MAX_LAG``).
    """
    from tenancy.statements import fetch_one

    for alias in _postgresql(databases):
        try:
            allowed = int(fetch_one(alias, store.SQL["prepared_transactions_allowed"])[0])
        except DatabaseError:
            continue  # tenancy.E010 reports a database it cannot inspect
        if allowed > 0:
            return [checks.Warning(
                f"Database {alias!r}: max_prepared_transactions is {allowed}, so any role, the "
                "web role included, may PREPARE TRANSACTION: a prepared transaction that "
                "published holds its tenants' delivery (every tenant's, if it was marked so) "
                "until someone runs COMMIT PREPARED or ROLLBACK PREPARED.",
                hint="Unless the application uses two-phase commit, set "
                "max_prepared_transactions = 0 in postgresql.conf (a restart); health reports a "
                "prepared transaction that holds delivery back (docs/operations.md).",
                id="outbox.W003",
            )]
        return []
    return []


#: Set while the check imports the tasks' modules: Celery's Django fix-up runs
#: Django's system checks when task modules are imported, which would run this
#: check again, and import again, without end.
_importing = threading.local()


def check_receivers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:  # an OUTBOX that cannot be read is check_settings' to report
        if getattr(_importing, "active", False) or outbox_settings.invalid_keys():
            return []
    except ConfigurationError:
        return []
    try:
        from outbox import celery as outbox_celery
    except ImportError:  # Celery is an optional extra: no receivers to check
        return []
    _importing.active = True
    try:
        app = outbox_celery.celery_app()
        app.loader.import_default_modules()
        problems = outbox_celery.check_app(app)
    except Exception as exc:  # a broken task module must not break every manage.py command
        return [checks.Warning(
            f"Could not load the Celery app to check its outbox receivers: "
            f"{type(exc).__name__}: {exc}",
            hint='OUTBOX["CELERY_APP"] names the app (docs/settings.md).',
            id="outbox.W100",
        )]
    finally:
        _importing.active = False
    return [checks.Warning(p.message, hint=p.hint, id=p.id) for p in problems]


def check_relay_broker(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``outbox.E110``-``E112``: RabbitMQ must confirm, keep its queues and persist messages."""
    from outbox.transports import CeleryTransport

    kind = _transport_class()
    if kind is None or not issubclass(kind, CeleryTransport):
        return []
    try:
        from outbox import celery as outbox_celery
    except ImportError:  # no Celery: the Celery transport cannot run at all
        return []
    if getattr(_importing, "active", False):
        return []
    try:
        app = outbox_celery.celery_app()
        problems = outbox_celery.check_broker(app)
    except Exception:  # outbox.W100 says the app could not be loaded
        return []
    return [checks.Error(p.message, hint=p.hint, id=p.id) for p in problems]


def check_tasks_transport(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``outbox.E120``/``W121``: the Django Tasks backend the relay enqueues to."""
    from outbox.transports import get_transport

    kind = _transport_class()
    if kind is None or kind.__module__ != "outbox.django_tasks":
        return []
    try:
        return list(get_transport().check())  # type: ignore[attr-defined]
    except Exception as exc:
        return [checks.Error(
            f"Could not load the Django tasks the outbox enqueues to: {type(exc).__name__}: {exc}",
            hint='OUTBOX["TASKS_TASK"] names them (docs/django-tasks.md).', id="outbox.E120")]


def _transport_class() -> type | None:
    """The class of ``OUTBOX["TRANSPORT"]``, or None when it cannot be had."""
    try:
        value = outbox_settings.TRANSPORT
        if isinstance(value, str):
            value = import_string(value)
    except Exception:  # a bad setting is reported by the settings check or the relay
        return None
    return value if isinstance(value, type) else type(value)
