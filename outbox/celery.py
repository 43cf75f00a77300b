"""The Celery side of receivers: retries, dead letters, and the settings they need.

A receiver task (:func:`receiver`) is where the relay's messages end, so its
failures must not lose them: retried with a growing pause, then parked
(:func:`outbox.receivers.retry_or_park`); never acknowledged without its effect
or its dead letter. That also takes a worker and broker set as docs/outbox.md's
table says (late acknowledgement, rejection when the pool process is lost or
hits its hard time limit, a visibility timeout longer than the task and its
pauses, Redis's append-only file), which this module checks (``manage.py
check`` and a warning when a worker starts). :class:`ReceiverTask` sets the
task's part whatever the app's defaults::

    @app.task(base=ReceiverTask, name="shop.send_receipt")
    @receiver("shop.send_receipt")
    def send_receipt(message): ...
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast
from urllib.parse import urlsplit

from celery import Task, current_app
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import worker_ready
from django.utils.module_loading import import_string
from kombu.utils.url import maybe_sanitize_url

from outbox import signing
from outbox.conf import outbox_settings
from outbox.exceptions import BadSignature
from outbox.receivers import receive, retry_or_park
from outbox.stream import Message

if TYPE_CHECKING:  # Task is generic in celery-types; older Celery's Task takes no subscript
    _TaskBase = Task[..., Any]
else:
    _TaskBase = Task

logger = logging.getLogger("outbox")

T = TypeVar("T")

#: How the dead letters of a Celery task are named in ``outbox_dead_letters.consumer``.
DEAD_LETTER_PREFIX = "celery:"

#: A broker's visibility timeout where the transport's own default applies (seconds).
_DEFAULT_VISIBILITY = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "sqs": 30.0}


class ReceiverTask(_TaskBase):
    """A Celery task base class for outbox receivers.

    Acknowledges late, rejects (so the broker delivers again) when its pool
    process is lost or killed by its hard time limit, and leaves its retries
    to :func:`outbox.receiver` (Celery's own ``max_retries`` does not count).
    """

    acks_late = True
    reject_on_worker_lost = True
    acks_on_failure_or_timeout = False
    acks_on_timeout = False  # Celery >= 5.5 reads this one for time limits
    max_retries = None


def dead_letter_name(task_name: str) -> str:
    """The ``consumer`` of a Celery task's dead letters: ``celery:<task name>``."""
    return f"{DEAD_LETTER_PREFIX}{task_name}"


def running_task(run: Callable[..., Any]) -> Task[..., Any] | None:
    """The task a worker is running with ``run`` as its body, else None.

    None when ``run`` is called as a plain function, through ``apply()`` or
    eagerly, or from inside another task's body.
    """
    task = current_app.current_task
    if task is None or getattr(task, "run", None) is not run:
        return None
    request = task.request
    if request.called_directly or request.is_eager:
        return None
    return cast("Task[..., Any]", task)


def receiver(
    name: str, *, using: str | None = None
) -> Callable[[Callable[..., T]], Callable[..., T | None]]:
    """Decorate a Celery task's function to receive outbox envelopes once each.

    The decorated function takes a :class:`~outbox.stream.Message` (plus any
    further arguments the task is called with) and is skipped for a duplicate
    (:func:`outbox.receivers.receive`). When a Celery worker runs it as a
    task's body, a failure is retried with backoff (1 s, doubled per attempt
    up to ``OUTBOX["RECEIVER_RETRY_BACKOFF_MAX"]``) up to
    ``OUTBOX["RECEIVER_MAX_ATTEMPTS"]`` attempts, then the message is parked
    in ``outbox_dead_letters`` as ``celery:<task name>`` (:func:`deliver`).
    Called directly, eagerly or by ``apply()``, a failure simply propagates.
    An envelope whose signature does not verify (``OUTBOX["SIGNING_KEYS"]``)
    is refused as :func:`~outbox.receivers.receive` refuses it, and a worker
    neither retries nor parks it.

    Example::

        @app.task(base=ReceiverTask, name="shop.order_created")
        @receiver("shop.order_created")
        def order_created(message):
            Invoice.objects.create(tenant_id=message.tenant_id, order_id=message.payload["id"])
    """

    def decorate(func: Callable[..., T]) -> Callable[..., T | None]:
        @functools.wraps(func)
        def wrapper(envelope: dict[str, Any] | Message, *args: Any, **kwargs: Any) -> T | None:
            def handle(message: dict[str, Any] | Message) -> T | None:
                _, result = receive(
                    message, lambda m: func(m, *args, **kwargs), receiver=name, using=using
                )
                return result

            task = running_task(wrapper)
            if task is None:
                return handle(envelope)
            return deliver(task, envelope, handle, using=using)

        wrapper.outbox_receiver = name  # type: ignore[attr-defined]
        return wrapper

    return decorate


def deliver(task: Task[..., Any], envelope: Any, handle: Callable[[Message], T],
            *, using: str | None = None) -> T:
    """Run ``handle(message)`` for ``task``: retry on failure, park when attempts run out.

    An envelope whose signature does not verify (``OUTBOX["SIGNING_KEYS"]``)
    is refused first, and for good: no retry could make it valid, and a dead
    letter would be a row written as the tenant a forger named.

    Raises:
        celery.exceptions.Retry: a retry was sent (Celery acknowledges this delivery).
        celery.exceptions.Reject: the retry could not be sent; the message goes
            back to the queue. Or the envelope's signature does not verify:
            the broker drops it (``requeue=False``).
        Exception: the handler's error, once the message is parked.
    """
    if not isinstance(envelope, Message):
        try:
            signing.check(envelope, by=f"task {task.name}")
        except BadSignature as exc:
            raise Reject(exc, requeue=False) from exc
    try:
        message = envelope if isinstance(envelope, Message) else Message.from_envelope(envelope)
    except (KeyError, TypeError, ValueError) as exc:
        logger.error("outbox: task %s[%s] received %r, which is not an outbox message: %s",
                     task.name, task.request.id, envelope, exc)
        raise
    try:
        return handle(message)
    except (Retry, Ignore, Reject):
        raise  # the handler's own instructions to Celery
    except Exception as exc:
        retry_or_park(task.name, dead_letter_name(task.name), message, task.request.retries + 1,
                      exc, functools.partial(_retry, task, exc), using=using)
        raise


def _retry(task: Task[..., Any], exc: Exception, _attempt: int, pause: float) -> NoReturn:
    # Celery's own limit must not stop us first: ours is the attempts setting.
    limit = task.request.retries + 1
    try:
        task.retry(exc=exc, countdown=pause, max_retries=limit)
    except Reject as rejected:
        # Celery could not send the retry (the broker is down) and would drop the
        # message: put it back instead. If even that fails, the broker keeps it
        # unacknowledged and delivers it again after its visibility timeout.
        # celery-types' Reject lacks the reason attribute that Celery's sets
        raise Reject(rejected.reason, requeue=True) from exc  # type: ignore[attr-defined]
    raise AssertionError("Task.retry() returned")  # pragma: no cover - it always raises


def celery_app() -> Any:
    """The Celery app the outbox sends to: ``OUTBOX["CELERY_APP"]``, else Celery's current app."""
    name = outbox_settings.CELERY_APP
    if not name:
        return current_app
    return import_string(name) if isinstance(name, str) else name


def route(app: Any, task: str) -> dict[str, Any]:
    """Celery's options for sending ``task`` from the outbox: its queue and exchange.

    ``OUTBOX["CELERY_QUEUE"]`` when set, else the app's routing (``task_routes``,
    then its default queue), as ``send_task`` routes a task.
    """
    queue = outbox_settings.CELERY_QUEUE
    return dict(app.amqp.router.route({"queue": queue} if queue else {}, task, (), {}))


def receiver_body(task_name: str) -> Callable[..., Any] | None:
    """The body of the receiver task ``task_name`` (its tasks' modules imported), or None."""
    app = celery_app()
    app.loader.import_default_modules()
    task = app.tasks.get(task_name)
    run = getattr(task, "run", None)
    return run if getattr(run, "outbox_receiver", None) else None


@dataclass(frozen=True)
class Problem:
    """A setting of a Celery app that breaks a receiver's promise."""

    id: str
    message: str
    hint: str


def receiver_tasks(app: Any) -> list[Any]:
    """The app's tasks whose body is an :func:`outbox.receiver`, by name."""
    return [task for name, task in sorted(app.tasks.items())
            if getattr(getattr(task, "run", None), "outbox_receiver", None)]


def visibility_timeout(app: Any) -> float | None:
    """The broker's visibility timeout in seconds, or None if the broker has none."""
    scheme = broker_scheme(app)
    if scheme not in _DEFAULT_VISIBILITY:
        return None
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", _DEFAULT_VISIBILITY[scheme]))


def check_app(app: Any) -> list[Problem]:
    """What in ``app``'s configuration lets a receiver lose a message or run it twice."""
    problems: list[Problem] = []
    hint = "Give the task base=outbox.celery.ReceiverTask (docs/outbox.md)."
    timeout = visibility_timeout(app)
    for task in receiver_tasks(app):
        name = task.name
        if not task.acks_late:
            problems.append(Problem(
                "outbox.W101",
                f"Celery task {name} receives outbox messages but acknowledges them early: "
                "a worker that dies while running it loses the message.", hint))
        if not task.reject_on_worker_lost:
            problems.append(Problem(
                "outbox.W102",
                f"Celery task {name} receives outbox messages but does not set "
                "reject_on_worker_lost: when its pool process dies, Celery acknowledges "
                "the message and its effect is lost.", hint))
        limit = task.time_limit or app.conf.task_time_limit
        acks_on_timeout = getattr(task, "acks_on_timeout", None)
        if acks_on_timeout is None:
            acks_on_timeout = task.acks_on_failure_or_timeout
        if limit and acks_on_timeout is not False:
            problems.append(Problem(
                "outbox.W103",
                f"Celery task {name} receives outbox messages and has a hard time limit "
                f"({limit} s), after which Celery acknowledges the message: its effect is lost.",
                hint))
        runtime = max(float(task.time_limit or app.conf.task_time_limit or 0),
                      float(task.soft_time_limit or app.conf.task_soft_time_limit or 0))
        pause = outbox_settings.RECEIVER_RETRY_BACKOFF_MAX
        if timeout is not None and (timeout <= runtime or timeout <= pause):
            longest = "its time limit" if timeout <= runtime else "the longest retry pause"
            problems.append(Problem(
                "outbox.W104",
                f"The broker's visibility timeout ({timeout:g} s) is not longer than "
                f"{longest} of Celery task {name}: the broker delivers the message a second "
                "time while the first delivery is still running or waiting.",
                'Raise broker_transport_options["visibility_timeout"], or lower the time '
                'limit or OUTBOX["RECEIVER_RETRY_BACKOFF_MAX"].'))
    return problems


#: Broker URL schemes of kombu's AMQP transports (RabbitMQ).
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp", "librabbitmq"})

#: Delivery modes kombu and Celery accept for a message the broker may forget.
_TRANSIENT = frozenset({1, "1", "transient"})


def broker_scheme(app: Any) -> str:
    """The scheme of the app's (first) broker URL: ``redis``, ``amqp``..., ``""`` if none."""
    url = str(app.conf.broker_url or "").split(";")[0]
    return urlsplit(url).scheme.split("+")[0]


def relay_queues(app: Any) -> dict[str, Any]:
    """The kombu Queue of each task ``OUTBOX["CELERY_TASK"]`` names, as :func:`route` routes it."""
    found = {task: route(app, task).get("queue") for task in sorted(
        set(outbox_settings.CELERY_TASK.values()))}
    return {task: queue for task, queue in found.items() if queue is not None}


def transient_reason(queue: Any) -> str | None:
    """Why RabbitMQ would forget ``queue`` (a kombu Queue) or its messages on a restart, or None."""
    if not queue.durable:
        return "is not durable (durable=False)"
    if queue.auto_delete:
        return "is deleted when its last consumer goes (auto_delete=True)"
    if queue.exclusive:
        return "is exclusive to one connection (exclusive=True)"
    if getattr(queue.exchange, "delivery_mode", None) in _TRANSIENT:
        return "has an exchange that sends its messages as transient (delivery_mode=1)"
    return None


def check_broker(app: Any) -> list[Problem]:
    """What in ``app``'s RabbitMQ setup lets the relay advance past a message the broker lost.

    Nothing for another broker. On RabbitMQ the relay's promise (every
    message it moves past is stored by the broker) needs publisher confirms
    (``broker_transport_options = {"confirm_publish": True}``: each publish
    waits for the broker's acknowledgement, which RabbitMQ sends for a
    persistent message on a durable queue once it is on disk), durable
    queues and persistent messages.
    """
    if broker_scheme(app) not in AMQP_SCHEMES:
        return []
    problems: list[Problem] = []
    options = app.conf.broker_transport_options or {}
    if not options.get("confirm_publish"):
        problems.append(Problem(
            "outbox.E110",
            "The Celery broker is RabbitMQ without publisher confirms: the relay would move "
            "its offset past messages RabbitMQ never stored, and a broker restart or a "
            "refused publish would lose them silently.",
            'Set broker_transport_options = {"confirm_publish": True} on the Celery app '
            "(docs/outbox.md, RabbitMQ)."))
    for task, queue in relay_queues(app).items():
        reason = transient_reason(queue)
        if reason is not None:
            problems.append(Problem(
                "outbox.E111",
                f"The queue {queue.name!r} that the outbox sends task {task} to {reason}: "
                "RabbitMQ loses its messages when it restarts, after the relay has moved past "
                "them.",
                "Declare it durable, not auto-delete or exclusive, with persistent delivery "
                "(kombu's defaults)."))
    if app.conf.task_default_delivery_mode in _TRANSIENT:
        problems.append(Problem(
            "outbox.E112",
            "task_default_delivery_mode is 'transient': the relay's messages and the receivers' "
            "retries are sent as transient, and RabbitMQ keeps those in memory only and loses "
            "them when it restarts, after the relay has moved past them.",
            "Set task_default_delivery_mode = 'persistent' (Celery's default)."))
    return problems


def redis_keeps_nothing(app: Any) -> str | None:
    """The broker's URL when it is a Redis without an append-only file, else None.

    None too when it cannot be asked (not Redis, ``CONFIG`` refused, unreachable).
    """
    if visibility_timeout(app) is None or not str(app.conf.broker_url).startswith("redis"):
        return None
    try:
        with app.connection_for_read() as connection:
            client = connection.default_channel.client
            appendonly = client.config_get("appendonly").get("appendonly")
    except Exception as exc:  # a managed Redis may refuse CONFIG: nothing to say then
        logger.debug("outbox: could not ask the broker about its persistence: %s", exc)
        return None
    return str(maybe_sanitize_url(app.conf.broker_url)) if appendonly == "no" else None


def warn_on_worker_start(sender: Any = None, **kwargs: Any) -> None:
    """``worker_ready`` handler: log what in this worker's setup can lose a message."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    for problem in check_app(app):
        logger.warning("outbox: %s (%s) %s", problem.message, problem.id, problem.hint)
    timeout = visibility_timeout(app)
    if timeout is not None and receiver_tasks(app):
        logger.info(
            "outbox: a message taken by a worker that dies is delivered again once the "
            "broker's visibility timeout (%g s) has passed", timeout)
    url = redis_keeps_nothing(app)
    if url is not None:
        logger.warning(
            "outbox: the Redis broker %s keeps no append-only file (appendonly no): a restart "
            "of Redis loses every queued task. Set appendonly yes (docs/operations.md); "
            "relay_outbox --rewind-to sends lost messages again. (outbox.W105)", url)


def connect_signals() -> None:
    """Connected by ``OutboxConfig.ready()``."""
    worker_ready.connect(warn_on_worker_start, dispatch_uid="outbox.celery.warn_on_worker_start")
