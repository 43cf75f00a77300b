"""The outbox on Django's Tasks framework, no Celery needed (docs/django-tasks.md).

``django.tasks`` (Django 6.0) or, else, its backport ``django_tasks``. The relay
enqueues each message as the task ``OUTBOX["TASKS_TASK"]`` names for its topic
(:class:`DjangoTasksTransport`); a receiver is a task made by
:func:`receiver_task`, with a Celery receiver's promises. At least once holds
as far as the backend stores a task before ``enqueue`` returns: django-tasks-db
does, a batch in one transaction (and :func:`requeue_stalled` gives back the
task of a worker that died); for any other the outbox cannot tell (``W121``);
the dummy backend keeps nothing (``E120``).
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from datetime import timedelta
from typing import Any, TypeVar

from django.apps import apps
from django.core import checks
from django.db import router, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from django_idempotency_outbox.errors import ConfigurationError
from outbox import signing
from outbox.conf import outbox_settings, task_for
from outbox.exceptions import BadSignature
from outbox.receivers import receive, retry_or_park
from outbox.stream import Message
from outbox.transports import Transport

T = TypeVar("T")

logger = logging.getLogger("outbox")

#: A receiver task still marked RUNNING this long after it started (seconds),
#: whose row no receiver holds, is made ready again by requeue_outbox_tasks
#: (``--stalled-after``): longer than a worker takes from claiming a task to
#: its receiver's first statement.
STALLED_AFTER = 30.0

#: How the dead letters of a Django task are named in ``outbox_dead_letters.consumer``.
DEAD_LETTER_PREFIX = "tasks:"


def tasks_api() -> Any:
    """``django.tasks`` where Django has it (6.0+), else the ``django_tasks`` backport.

    Raises:
        ImportError: neither is installed.
    """
    try:
        return importlib.import_module("django.tasks")
    except ImportError:
        return importlib.import_module("django_tasks")


def _task_class() -> type:
    return importlib.import_module(tasks_api().__name__ + ".base").Task  # type: ignore[no-any-return]


def _database_backend() -> type | None:
    """django-tasks-db's backend class, or None when it is not installed."""
    try:
        from django_tasks_db.backend import DatabaseBackend
    except ImportError:
        return None
    return DatabaseBackend


def _uses_database(backend: Any) -> bool:
    """Whether ``backend`` is django-tasks-db's."""
    found = _database_backend()
    return found is not None and isinstance(backend, found)


def _dummy_backend() -> type | None:
    try:
        return importlib.import_module(  # type: ignore[no-any-return]
            tasks_api().__name__ + ".backends.dummy").DummyBackend
    except (ImportError, AttributeError):
        return None


def dead_letter_name(task_path: str) -> str:
    """The ``consumer`` of a Django task's dead letters: ``tasks:<task path>``."""
    return f"{DEAD_LETTER_PREFIX}{task_path}"


def load_task(path: str) -> Any:
    """The Django Task at dotted ``path``.

    Raises:
        ConfigurationError: it cannot be imported, or is not a Task.
    """
    try:
        found = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import the Django task {path!r}: {exc}") from exc
    if not isinstance(found, _task_class()):
        raise ConfigurationError(
            f"{path!r} is a {type(found).__name__}, not a Django task (decorate it with "
            "@outbox.django_tasks.receiver_task or django.tasks' @task)")
    return found


def configured_task_paths() -> list[str]:
    """The tasks ``OUTBOX["TASKS_TASK"]`` names, each once."""
    return sorted(set(outbox_settings.TASKS_TASK.values()))


class DjangoTasksTransport(Transport):
    """Enqueues each message as a Django task: the one ``OUTBOX["TASKS_TASK"]`` names for its topic.

    The task is called with the message's envelope (a JSON-serialisable dict,
    signed when ``SIGNING_KEYS`` is set). When every task of a batch uses
    django-tasks-db, the batch is enqueued in one transaction on the tasks'
    database: it is committed whole before :meth:`send` returns (and the relay
    advances), or not at all. Other backends enqueue message by message; a
    failure part-way raises and the relay sends the whole batch again
    (receivers drop what they had).
    """

    def task_for(self, topic: str) -> Any:
        return load_task(task_for("TASKS_TASK", "Django", topic))

    def send(self, messages: Sequence[Message]) -> None:
        routes: dict[str, Any] = {}  # topic -> task; configuration errors before any I/O
        for message in messages:
            if message.topic not in routes:
                routes[message.topic] = self.task_for(message.topic)
        tasks = [routes[m.topic] for m in messages]
        database = self._one_database(routes.values())
        with nullcontext() if database is None else transaction.atomic(using=database):
            for message, task in zip(messages, tasks, strict=True):
                task.enqueue(message.envelope())

    @staticmethod
    def _one_database(tasks: Iterable[Any]) -> str | None:
        """The database alias of django-tasks-db when every task uses it, else None.

        The alias of its queue: ``tenancy.routers.AppDatabaseRouter`` sends it to
        the worker alias, the relay's own (the queue holds every tenant's
        envelopes and has no row-level security: the web role has no privilege
        on it, ``outbox.E124``).
        """
        return queue_alias() if all(_uses_database(t.get_backend()) for t in tasks) else None

    def check(self) -> list[checks.CheckMessage]:
        """``outbox.E120``: no task, or a backend that keeps nothing; ``W121``: one we
        cannot vouch for."""
        paths = configured_task_paths()
        problems = _check_queue_alias()
        if not paths:
            return [*problems, checks.Error(
                "OUTBOX[\"TRANSPORT\"] is the Django tasks transport but no task is set.",
                hint='Set OUTBOX["TASKS_TASK"] (a task, or a dict topic -> task).',
                id="outbox.E120")]
        durable, dummy = _database_backend(), _dummy_backend()
        for path in paths:
            backend = load_task(path).get_backend()
            name = f"{type(backend).__module__}.{type(backend).__name__}"
            if dummy is not None and isinstance(backend, dummy):
                problems.append(checks.Error(
                    f"The Django task {path} uses {name}, which keeps tasks in memory and runs "
                    "none: every message the relay moves past would be lost.",
                    hint="Use django-tasks-db's DatabaseBackend (docs/django-tasks.md).",
                    id="outbox.E120"))
            elif durable is None or not isinstance(backend, durable):
                problems.append(checks.Warning(
                    f"The Django task {path} uses {name}: the relay moves past a message once "
                    "enqueue() returns, and the outbox cannot tell whether this backend has "
                    "stored the task durably by then.",
                    hint="django-tasks-db's DatabaseBackend commits the batch before the relay "
                    "advances (docs/django-tasks.md).",
                    id="outbox.W121"))
        return problems


def queue_alias() -> str:
    """The alias of django-tasks-db's queue, where the relay enqueues and its worker claims:
    the router's, as django-tasks-db asks it."""
    from django_tasks_db.models import DBTaskResult

    return router.db_for_write(DBTaskResult)


def _check_queue_alias() -> list[checks.CheckMessage]:
    """``outbox.E124``: django-tasks-db's queue is routed to the web process's alias."""
    from tenancy.aliases import app_alias

    if _database_backend() is None or "django_tasks_db" not in {
            c.name for c in apps.get_app_configs()}:
        return []
    alias = queue_alias()
    if alias != app_alias():
        return []
    return [checks.Error(
        f"django-tasks-db's queue is routed to {alias!r}, the web process's alias: the relay "
        "would enqueue every tenant's envelopes there as the web role, which has no "
        "privilege on the queue (it has no row-level security).",
        hint='Add "tenancy.routers.AppDatabaseRouter" to DATABASE_ROUTERS: it sends the queue '
        'to TENANCY["WORKER_DATABASE"] (docs/django-tasks.md).',
        id="outbox.E124")]


def receiver_task(
    name: str, *, using: str | None = None, **task_options: Any
) -> Callable[[Callable[[Message], Any]], Any]:
    """Make ``func(message)`` a Django task that receives outbox envelopes once each.

    Args:
        name: the receiver's stable name (its rows in ``outbox_received``).
        using: the app database alias (``TENANCY["APP_DATABASE"]``).
        task_options: for Django's ``@task`` (``queue_name``, ``priority``,
            ``backend``); ``takes_context`` is the receiver's own.

    The task takes the envelope (and the attempt, which the receiver passes
    itself when it retries). It runs ``func`` as the message's tenant, in one
    transaction with the receiver's record; a duplicate is skipped. A failure
    enqueues the task again for the next attempt (after the retry pause, when
    the backend supports ``run_after``) and, after ``RECEIVER_MAX_ATTEMPTS``,
    parks the message as ``tasks:<task path>``. An envelope whose signature
    does not verify (``SIGNING_KEYS``), or that is not an outbox message, is
    refused: logged as an ERROR, never retried or parked.

    The task ends SUCCESSFUL whenever the message's fate is settled; its
    return value's ``"outcome"`` says how: ``handled``, ``duplicate``,
    ``retried`` (a new task runs the next attempt), ``parked`` or ``refused``.
    It ends FAILED only when the receiver could not settle it (the retry could
    not be enqueued, nor the message parked): ``requeue_outbox_tasks`` makes
    such a task ready again.
    """

    def decorate(func: Callable[[Message], Any]) -> Any:
        def run(context: Any, envelope: Any, attempt: int = 1) -> dict[str, Any]:
            with _holding(context.task_result.task.get_backend(), using):
                return _run(context, envelope, attempt, func, name, using)

        # Django imports a task by its function's module and qualified name: the
        # task must be found where the decorated function is.
        run.__module__ = func.__module__
        run.__name__ = func.__name__
        run.__qualname__ = func.__qualname__
        run.__doc__ = func.__doc__
        run.outbox_receiver = name  # type: ignore[attr-defined]
        run.outbox_handler = func  # type: ignore[attr-defined]
        run.outbox_using = using  # type: ignore[attr-defined]
        return tasks_api().task(takes_context=True, **task_options)(run)

    return decorate


def _run(context: Any, envelope: Any, attempt: int, func: Callable[[Message], Any],
         name: str, using: str | None) -> dict[str, Any]:
    result = context.task_result
    task = result.task
    by = f"task {task.module_path}[{result.id}]"
    try:
        signing.check(envelope, by=by)
    except BadSignature as exc:
        return {"outcome": "refused", "reason": str(exc)}
    try:
        message = Message.from_envelope(envelope)
    except (KeyError, TypeError, ValueError) as exc:
        logger.error("outbox: %s received %r, which is not an outbox message: %s; it is not "
                     "handled, retried or parked", by, envelope, exc)
        return {"outcome": "refused", "reason": f"not an outbox message: {exc}"}
    hold = functools.partial(_hold, result.id, task.get_backend())
    try:
        handled, _ = receive(message, lambda m: (hold(), func(m))[1], receiver=name, using=using)
    except Exception as exc:
        return _failed(task, envelope, message, attempt, exc, using)
    return {"outcome": "handled" if handled else "duplicate"}


def _holding(backend: Any, using: str | None) -> Any:
    """A transaction on the queue's alias around the receiver's, when they are two aliases.

    The queue is the worker role's (on the worker alias), the receiver runs as
    the web role (on the app alias): the lock :func:`_hold` takes on the task's
    row then lives in this transaction, which ends just after the receiver's
    (or with it, when its worker is killed), and a retry it enqueues commits
    with it.
    """
    from tenancy.aliases import app_alias

    if not _uses_database(backend) or queue_alias() == app_alias(using):
        return nullcontext()
    return transaction.atomic(using=queue_alias())


def _hold(result_id: str, backend: Any) -> None:
    """Lock this task's row of django-tasks-db while the receiver's transaction runs.

    While the receiver runs, its row is locked; once the receiver's
    transaction ends (committed, rolled back, or its worker killed) it is not.
    :func:`requeue_stalled` skips locked rows: a RUNNING task whose row is free
    past :data:`STALLED_AFTER` has no live receiver.
    """
    if not _uses_database(backend):
        return
    from django_tasks_db.models import DBTaskResult

    database = queue_alias()
    if not transaction.get_connection(database).in_atomic_block:
        return  # the tasks live in another database than the receiver's transaction
    list(DBTaskResult.objects.using(database).select_for_update()
         .filter(id=result_id).values_list("id", flat=True))


def _failed(task: Any, envelope: Any, message: Message, attempt: int, exc: Exception,
            using: str | None) -> dict[str, Any]:
    path = task.module_path
    error = f"{type(exc).__name__}: {exc}"
    next_attempt = retry_or_park(
        path, dead_letter_name(path), message, attempt, exc,
        lambda number, pause: _enqueue_again(task, envelope, number, pause), using=using)
    if next_attempt is None:
        return {"outcome": "parked", "attempts": attempt, "error": error}
    return {"outcome": "retried", "next_attempt": next_attempt, "error": error}


def _enqueue_again(task: Any, envelope: Any, attempt: int, pause: float) -> None:
    """Enqueue ``task`` for ``attempt``, after ``pause`` where the backend can defer.

    If this raises (the backend is unreachable), so does the task: it ends
    FAILED, and ``requeue_outbox_tasks`` makes it ready again.
    """
    again = task
    if task.get_backend().supports_defer and pause > 0:
        again = task.using(run_after=timezone.now() + timedelta(seconds=pause))
    again.enqueue(envelope, attempt=attempt)


def requeue_stalled(*, stalled_after: float | None = None) -> int:
    """Make ready again the receiver tasks of django-tasks-db that no live worker holds.

    A task the worker marked RUNNING more than ``stalled_after`` seconds ago
    (:data:`STALLED_AFTER` unless given) whose row no receiver holds locked (its
    worker died mid-task: its transaction, and with it the receiver's effects
    and record, was rolled back), and a receiver task that ended FAILED (it
    could not settle its message), is set READY: a worker runs it again, and
    the receiver's record drops it if it had been handled after all. Only the
    tasks ``TASKS_TASK`` names are touched.

    Returns:
        how many tasks were made ready.

    Raises:
        ConfigurationError: django-tasks-db is not installed.
    """
    if _database_backend() is None:
        raise ConfigurationError("requeue_outbox_tasks needs django-tasks-db (django_tasks_db)")
    from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
    from django.db.models.functions import Now
    from django_tasks_db.models import DBTaskResult

    after = STALLED_AFTER if stalled_after is None else stalled_after
    paths = configured_task_paths()
    database = queue_alias()
    before = ExpressionWrapper(Now() - Value(timedelta(seconds=after)),
                               output_field=DateTimeField())
    rows = DBTaskResult.objects.using(database)
    with transaction.atomic(using=database):
        stalled = list(
            rows.select_for_update(skip_locked=True)
            .filter(task_path__in=paths)
            .filter(Q(status="RUNNING", started_at__lt=before) | Q(status="FAILED"))
            .values_list("id", flat=True))
        if stalled:
            rows.filter(id__in=stalled).update(status="READY", finished_at=None)
    for task_id in stalled:
        logger.warning("outbox: receiver task %s had no live worker; it is ready to run again",
                       task_id)
    return len(stalled)


def redrive_handler(consumer: str) -> Callable[[Message], object] | None:
    """For a dead letter of ``tasks:<task path>``: the receiver's body with its de-duplication.

    None when the path names no receiver task.
    """
    path = consumer.removeprefix(DEAD_LETTER_PREFIX)
    try:
        task = load_task(path)
    except ConfigurationError:
        return None
    func = task.func
    name = getattr(func, "outbox_receiver", None)
    handler = getattr(func, "outbox_handler", None)
    if name is None or handler is None:
        return None
    using = getattr(func, "outbox_using", None)

    def handle(message: Message) -> object:
        return receive(message, handler, receiver=name, using=using)

    return handle
