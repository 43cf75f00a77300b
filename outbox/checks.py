"""System checks of the outbox: is the fence still sound, can the receivers keep their promise?

Its families, registered together by :func:`register`:

- **Its settings** (``outbox.E090``, ``E091``): ``OUTBOX`` is a dict of
  convertible values, of keys it takes (a removed key is named with what
  replaces it).

- **The fence** (``outbox.E001``/``E002``, tagged ``database``). The fence
  (docs/guarantees.md) rests on two facts the database could be talked out
  of after the migrations created them: message ids come from the trigger
  ``outbox_messages_mark_publisher`` (which marks the writing transaction as
  a publisher in flight for the row's tenant), and its sequence hands out
  increasing values across sessions (no values cached per session, no
  cycling, a positive increment). ``manage.py
  check --database <alias>`` (and ``migrate``) verifies both.
- **Seeing what holds delivery back** (``outbox.I130``, advice, tagged ``database``):
  the system (or admin) alias's role should be a member of
  ``pg_read_all_stats``, or PostgreSQL hides how long a publishing
  transaction has been open, and its query, from ``outbox_status``, the
  health check and the blocker-age metric.
- **Two-phase commit** (``outbox.W003``, a deployment check: ``check --deploy
  --database <alias>``): a server that allows prepared transactions lets the
  web role leave one that holds delivery back until someone ends it.
- **The relay's broker** (``outbox.E110``–``E112``). When the relay sends
  through the Celery transport to RabbitMQ, publisher confirms, durable
  queues and persistent messages are what make the broker's acknowledgement
  mean "stored": without one of them the relay would advance past messages a
  broker restart loses (:func:`outbox.celery.check_broker`). Errors: the
  relay's own promise, not a worker's, is at stake, and ``relay_outbox``
  does not start with them.
- **The Django tasks transport** (``outbox.E120``, ``outbox.W121``): a Tasks
  backend that keeps nothing (the dummy backend) cannot take the relay's
  messages; one the outbox cannot vouch for is a warning
  (:mod:`outbox.django_tasks`).
- **The receivers** (``outbox.W100``–``W105``). ``manage.py check`` loads the
  Celery app the outbox sends to (``OUTBOX["CELERY_APP"]``), imports its
  tasks' modules, and warns about each receiver task
  (:func:`outbox.receiver`) whose settings let a message be lost or run twice
  (:func:`outbox.celery.check_app`). A worker logs the same warnings when it
  starts, with what only it can see (its broker's persistence). Warnings, not
  errors: the web process and the workers may be configured apart, and the
  worker's own warning is the one that sees its setup.
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


# -- the fence ----------------------------------------------------------------

def check_fence(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for alias in databases or ():
        if alias not in settings.DATABASES:
            continue
        if "postgresql" not in settings.DATABASES[alias].get("ENGINE", ""):
            continue  # tenancy.E005 reports it
        try:
            facts = store.fence_facts(alias)
        except DatabaseError:
            continue  # not migrated yet (tenancy.E010 reports a database it cannot inspect)
        if facts is None:
            continue  # before the outbox's migration 0003
        cache, increment, cycle = facts.cache, facts.increment, facts.cycle
        if cache != 1 or increment <= 0 or cycle:
            errors.append(
                checks.Error(
                    f"Database {alias!r}: the sequence outbox_message_ids has CACHE {cache}, "
                    f"INCREMENT {increment}, {'CYCLE' if cycle else 'NO CYCLE'}: ids would not "
                    "increase across sessions, and readers could skip messages committed late.",
                    hint="ALTER SEQUENCE outbox_message_ids CACHE 1 INCREMENT 1 NO CYCLE; "
                    "(docs/guarantees.md).",
                    id="outbox.E001",
                )
            )
        if not facts.marker_exists:
            continue  # before the outbox's migration 0008 (migrate says so)
        if facts.marking not in ("O", "A") or facts.id_default is not None:
            found = ("no trigger marks publishers" if facts.marking is None
                     else f"the marking trigger is disabled (tgenabled {facts.marking!r})"
                     if facts.marking not in ("O", "A")
                     else f"outbox_messages.id has the default {facts.id_default!r}")
            errors.append(
                checks.Error(
                    f"Database {alias!r}: {found}. Each new message must take its id from "
                    "the trigger outbox_messages_mark_publisher (outbox_mark_publisher_v2()), "
                    "which marks its transaction as a publisher in flight; without it, "
                    "readers could skip messages committed late.",
                    hint="ALTER TABLE outbox_messages ENABLE TRIGGER "
                    "outbox_messages_mark_publisher; ALTER TABLE outbox_messages ALTER COLUMN "
                    "id DROP DEFAULT; (docs/guarantees.md).",
                    id="outbox.E002",
                )
            )
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
    """``outbox.W003`` (``check --deploy --database <alias>``): the server lets any role,
    the web role included, ``PREPARE TRANSACTION``.

    PostgreSQL has no privilege for two-phase commit: with
    ``max_prepared_transactions`` above 0 every role may prepare. A prepared
    transaction that published outlives its session and holds its tenants'
    delivery (every tenant's, when it was marked as publishing for any tenant)
    until someone runs ``COMMIT PREPARED`` or ``ROLLBACK PREPARED``. Health
    reports it once it is older than ``HEALTH_MAX_LAG``; unless the
    application uses two-phase commit, keep it from happening at all.
    """
    from outbox.store import SQL
    from tenancy.statements import fetch_one

    for alias in databases or ():
        if alias not in settings.DATABASES:
            continue
        if "postgresql" not in settings.DATABASES[alias].get("ENGINE", ""):
            continue  # tenancy.E005 reports it
        try:
            allowed = int(fetch_one(alias, SQL["prepared_transactions_allowed"])[0])
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


# -- the receivers ------------------------------------------------------------

#: Set while the check imports the tasks' modules: Celery's Django fix-up runs
#: Django's system checks when task modules are imported, which would run this
#: check again, and import again, without end.
_importing = threading.local()


def _settings_unreadable() -> bool:
    """Whether ``OUTBOX`` cannot be read (not a dict, a bad value: check_settings says so)."""
    try:
        return bool(outbox_settings.invalid_keys())
    except ConfigurationError:
        return True


def check_receivers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if getattr(_importing, "active", False) or _settings_unreadable():
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


# -- the relay's broker ----------------------------------------------------------


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
            f"Could not load the Django tasks the outbox enqueues to: {type(exc).__name__}: "
            f"{exc}",
            hint='OUTBOX["TASKS_TASK"] names them '
            "(docs/django-tasks.md).",
            id="outbox.E120",
        )]


def _transport_class() -> type | None:
    """The class of ``OUTBOX["TRANSPORT"]``, or None when it cannot be had."""
    try:
        value = outbox_settings.TRANSPORT
        if isinstance(value, str):
            value = import_string(value)
    except Exception:  # a bad setting is reported by the settings check or the relay
        return None
    return value if isinstance(value, type) else type(value)
