"""Phases mode: idempotent requests that call systems outside the database.

A payment capture cannot be one transaction: the gateway's charge is outside
PostgreSQL. Such a request is a program of phases (a :class:`Phases`
subclass), each one transaction in ``tenant_context`` whose return value
commits with its writes: :class:`RecoveryPoint` goes on at another phase,
:class:`Finish` stores the final answer. The key is claimed first, committed
on its own with a lease and a fencing token; each commit is a compare-and-set
on the token, so an owner whose lease was taken over cannot commit over the
new owner (:class:`LeaseLost`). A transient failure releases the lease and a
retry resumes at the stored recovery point; a request that fails before
anything of it happened is forgotten (:class:`_Run`). docs/phases.md has the
example, each kind of crash, fencing and the completer.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, transaction
from django.utils.datastructures import MultiValueDict

from django_idempotency_outbox.errors import ConfigurationError
from django_idempotency_outbox.problems import reason_phrase
from idempotency import store
from idempotency.conf import (
    LEASE,
    RETRY_AFTER,
    STATUS_ABANDONED,
    as_timedelta,
    idempotency_settings,
)
from idempotency.core import (
    IdempotentRequest,
    Outcome,
    Result,
    StoredResponse,
    Verdict,
    answer_from_row,
    classify,
    retry_while_in_progress,
)
from idempotency.exceptions import IdempotencyError, LeaseLost, UnknownRecoveryPoint
from idempotency.fingerprints import canonical_json
from idempotency.inputs import check_storable
from tenancy import tenant_context
from tenancy.aliases import app_alias

#: The recovery point of a claimed request that has run no phase yet.
STARTED = "started"

logger = logging.getLogger("idempotency")

_registry: dict[str, type[Phases]] = {}


@dataclass(frozen=True)
class RecoveryPoint:
    """Returned by a phase: commit its writes and go on at ``name``.

    Keyword arguments are merged into ``ctx.state`` (JSON), committed with
    the phase, and available to later phases, retries and the completer.
    """

    name: str
    state: dict[str, Any] = field(default_factory=dict)

    def __init__(self, name: str, **state: Any) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "state", state)


@dataclass(frozen=True)
class Finish:
    """Returned by a phase: the request's answer.

    A 2xx/3xx or final 4xx is stored with the key and replayed; a 5xx (or a
    status in ``UNSTORED_STATUS_CODES``) is answered but treated as
    transient, like :class:`Retry`. ``data`` is rendered as JSON.
    """

    status: int
    data: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def to_stored(self) -> StoredResponse:
        headers: list[tuple[str, str]] = []
        body = b""
        if self.data is not None:
            body = json.dumps(self.data, cls=DjangoJSONEncoder, separators=(",", ":")).encode()
            headers.append(("Content-Type", "application/json"))
        headers.extend((k, v) for k, v in self.headers.items() if k.lower() != "content-type")
        return StoredResponse(self.status, body, tuple(headers))


class Retry(IdempotencyError):  # noqa: N818 - reads as the instruction it is
    """Raise in a phase to declare a transient failure (e.g. a gateway timeout).

    The phase rolls back, the lease is released, nothing final is stored, and
    the client gets ``status`` (503 by default, never stored, whatever it
    is) with ``Retry-After``; its retry resumes at the same recovery point
    (or, if nothing of the request happened yet, runs it anew).
    """

    def __init__(self, detail: str = "Temporarily unavailable; retry.", *, status: int = 503,
                 retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.retry_after = retry_after

    def to_stored(self) -> StoredResponse:
        body = {"type": "about:blank", "title": reason_phrase(self.status), "status": self.status,
                "detail": self.detail, "code": "retry"}
        after = self.retry_after or RETRY_AFTER
        return StoredResponse(
            self.status,
            json.dumps(body, separators=(",", ":")).encode(),
            (("Content-Type", "application/problem+json"), ("Retry-After", str(after))),
        )


@dataclass
class PhaseContext:
    """What a phase knows about its request.

    Attributes:
        tenant_id, scope, key: the idempotency key.
        data: the parsed request body, as JSON (files as their digests).
        kwargs: the URL keyword arguments of the view.
        principal: who asked (see ``get_idempotency_principal``).
        state: JSON dict carried from phase to phase (see :class:`RecoveryPoint`).
        recovery_point: the phase being run.
        attempt: the fencing token of this run (1 for the first claim).
    """

    tenant_id: int
    scope: str
    key: str
    data: Any
    kwargs: dict[str, Any]
    principal: str
    state: dict[str, Any]
    recovery_point: str
    attempt: int
    request_id: str
    #: Whether :meth:`foreign_key` was called in this run: a foreign system may
    #: then know this request, and its key must be kept (see :class:`_Run`).
    foreign_key_used: bool = field(default=False, repr=False)

    def foreign_key(self, name: str = "") -> str:
        """An idempotency key for a foreign call, stable across retries.

        Derived from this request's identity (a UUID drawn when the key was
        first claimed) and ``name``, so two foreign calls of one request, or
        the same call of two requests, never share a key. Asking for one
        marks the request as known outside: from then on a failure keeps the
        key pending (for a retry to reuse the same foreign key) instead of
        forgetting it.
        """
        self.foreign_key_used = True
        digest = hashlib.sha256(f"{self.request_id}\x1f{name}".encode()).hexdigest()
        return f"idem_{digest[:40]}"


class Phases:
    """Base class of a phases program: one method per recovery point.

    Class attributes:
        scope: the operation; keys are unique per tenant and scope.
        first: the recovery point of a new request (``"started"``).
        lease: how long a run owns the key before a retry may take over
            (timedelta or seconds; 30 s by default). A
            phase longer than the lease can be taken over mid-way; its commit
            is then refused.
        ttl: how long the final answer is replayed (``IDEMPOTENCY["TTL"]``).
        completable: let the completer finish requests abandoned by clients.
        data_fields: the fields of the request body the program reads: they
            are ``ctx.data``, and they are stored with the pending key so that
            a retry or the completer resumes with them. ``()`` (the default)
            stores none; ``"__all__"`` stores the whole body. At most
            ``MAX_STORED_DATA`` bytes are stored, more is refused (413).
    """

    scope: ClassVar[str] = ""
    first: ClassVar[str] = STARTED
    lease: ClassVar[timedelta | int | float | None] = None
    ttl: ClassVar[timedelta | int | None] = None
    completable: ClassVar[bool] = False
    data_fields: ClassVar[tuple[str, ...] | list[str] | str] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "scope" in vars(cls) and cls.scope:
            register(cls)

    def phase(self, name: str) -> Callable[[PhaseContext], Any]:
        method = getattr(self, name, None)
        if name.startswith("_") or not callable(method) or name in _RESERVED:
            raise UnknownRecoveryPoint(
                f"{type(self).__qualname__} has no phase for recovery point {name!r}"
            )
        return method  # type: ignore[no-any-return]


_RESERVED = frozenset(dir(Phases))


def register(program: type[Phases]) -> None:
    """Make ``program`` the one program of its scope (done by subclassing :class:`Phases`).

    Programs are found by scope, by a retry in another process and by the
    completer: ``IdempotencyConfig.ready()`` imports every installed app's
    ``phases`` module so that each process knows the same programs.

    Raises:
        ConfigurationError: another program already has this scope (a class
            defined again by the same module and name replaces itself).
    """
    existing = _registry.get(program.scope)
    if existing is not None and _name(existing) != _name(program):
        raise ConfigurationError(
            f"Phases programs {_name(existing)} and {_name(program)} both have scope "
            f"{program.scope!r}: a key's scope names one program. Give one of them another "
            "scope."
        )
    _registry[program.scope] = program


def _name(program: type[Phases]) -> str:
    return f"{program.__module__}.{program.__qualname__}"


def program_for(scope: str) -> type[Phases] | None:
    """The program class registered for ``scope`` (by subclassing :class:`Phases`)."""
    return _registry.get(scope)


def completable_scopes() -> list[str]:
    """Scopes whose programs the completer may finish."""
    return sorted(scope for scope, program in _registry.items() if program.completable)


def abandoned_answer() -> StoredResponse:
    """The answer stored for a request given up on, replayed to every retry of its key.

    A problem+json with status 500 and the code
    ``idempotency_request_abandoned``: the request may have partly taken effect
    (a charge without its receipt, say), and is not run again under this key.
    """
    status = STATUS_ABANDONED
    body = {
        "type": "about:blank",
        "title": "Request abandoned",
        "status": status,
        "detail": "This request could not be completed and will not be run again under this "
                  "idempotency key. Part of it may have taken effect: check its outcome "
                  "before sending it again with a new key.",
        "code": "idempotency_request_abandoned",
    }
    return StoredResponse(
        status, json.dumps(body, separators=(",", ":")).encode(),
        (("Content-Type", "application/problem+json"),),
    )


def ttl_of(program: type[Phases] | None) -> timedelta:
    """How long a finished answer of ``program`` is replayed (its ``ttl``, else ``TTL``)."""
    if program is not None and program.ttl is not None:
        return as_timedelta(program.ttl, f"{program.__qualname__}.ttl")
    return idempotency_settings.TTL


#: ``data_fields`` value that keeps the whole body.
ALL_FIELDS = "__all__"


def program_data(program: type[Phases], body: Any) -> Any:
    """The part of a parsed body that ``program`` reads (``ctx.data``), as JSON.

    The fields named by ``data_fields`` of an object body (a form's fields
    as lists of strings), or the whole body for ``"__all__"``; uploaded files
    count by their digests. Absent fields are left out.
    """
    fields = program.data_fields
    if fields == ALL_FIELDS:
        picked = body
    elif isinstance(body, MultiValueDict):
        picked = {name: body.getlist(name) for name in fields if name in body}
    elif isinstance(body, Mapping):
        picked = {name: body[name] for name in fields if name in body}
    else:
        picked = {}
    return json.loads(canonical_json(picked))


def lease_of(program: type[Phases]) -> timedelta:
    value = program.lease if program.lease is not None else LEASE
    return as_timedelta(value, f"{program.__qualname__}.lease")


def execute(
    program: type[Phases],
    request: IdempotentRequest,
    *,
    data: Any = None,
    kwargs: Mapping[str, Any] | None = None,
    principal: str = "",
    on_exception: Callable[[Exception], StoredResponse | None] | None = None,
    wait: float | None = None,
    using: str | None = None,
) -> Result[StoredResponse]:
    """Run ``program`` for ``request`` from its last recovery point, or answer from the key.

    Args:
        program: the :class:`Phases` subclass.
        request: the key and the request's fingerprint (``request.scope``
            should be ``program.scope``).
        data, kwargs, principal: what the phases see in ``ctx``; stored with
            the key so that a retry after a crash, or the completer, sees the
            same (``data`` must be JSON-serialisable; the mixin passes
            :func:`program_data`).
        on_exception: turns an exception raised by a phase into an answer
            (e.g. DRF's ``ValidationError`` into its 400), or returns None to
            treat it as transient and re-raise it. Answers are then stored or
            not by their status, like :class:`Finish`.
        wait: seconds to wait for a run in flight (``IN_PROGRESS_WAIT``).
        using: the app database alias.

    Returns:
        A :class:`~idempotency.core.Result` whose ``value`` (when executed) and
        ``stored`` (when replayed) are :class:`StoredResponse` objects.

    Raises:
        RequestRefused: before anything is stored, when what would be stored
            is over ``MAX_STORED_DATA`` bytes or holds a NUL character.
    """
    alias = app_alias(using)
    if connections[alias].in_atomic_block:
        raise RuntimeError(
            "Phases mode commits the key before the work and each phase on its own; it "
            "cannot run inside transaction.atomic() (with ATOMIC_REQUESTS, mark the view "
            "with django.db.transaction.non_atomic_requests)."
        )
    lease = lease_of(program)
    ttl = request.ttl or ttl_of(program)
    stored_data = {"data": data, "kwargs": dict(kwargs or {}), "principal": principal}
    check_storable(stored_data)
    claimed = retry_while_in_progress(
        lambda: _claim(request, program, stored_data, lease, ttl, alias), wait
    )
    if not isinstance(claimed, _Claimed):
        return claimed
    claim = claimed.claim
    ctx = PhaseContext(
        tenant_id=request.tenant_id,
        scope=request.scope,
        key=request.key,
        data=data,
        kwargs=dict(kwargs or {}),
        principal=principal,
        state=claim.phase_state,
        recovery_point=claim.recovery_point,
        attempt=claim.token,
        request_id=claim.request_id,
    )
    run = _Run(program(), ctx, request, claim.token, claimed.fresh, lease, ttl, alias)
    return run.execute(on_exception)


@dataclass(frozen=True)
class _Claimed:
    claim: store.Claim
    fresh: bool  # a new request (not a take-over of a pending key): nothing of it ran before


def _claim(
    request: IdempotentRequest,
    program: type[Phases],
    stored_data: dict[str, Any],
    lease: timedelta,
    ttl: timedelta,
    alias: str,
) -> _Claimed | Result[StoredResponse]:
    for _ in range(2):  # a second look when another request claimed the key first
        with tenant_context(request.tenant_id, using=alias):
            found = store.lookup(alias, request)
            if found.live and found.fingerprint != request.fingerprint:
                return Result(Outcome.MISMATCH)
            if found.live and found.state != "pending":
                return answer_from_row(request, found)
            if found.live and found.leased:
                return Result(Outcome.IN_PROGRESS)
            if found.live:
                assert found.lease_token is not None
                claim = store.take_over(alias, request, found.lease_token, lease)
            else:
                claim = store.claim(
                    alias, request, recovery_point=program.first, request_data=stored_data,
                    lease=lease, ttl=ttl,
                )
        if claim is not None:
            return _Claimed(claim, fresh=not found.live)
    return Result(Outcome.IN_PROGRESS)


class _Run:
    """One run of a program for a claimed key, from its recovery point to an outcome.

    What becomes of the key:

    - a :class:`Finish` (or a DRF exception's answer) that is stored (2xx,
      3xx, final 4xx) finishes it, and is replayed to every retry;
    - nothing else is stored, and the key is **forgotten** if the request is
      still *pristine*: a new request (not a take-over) whose run committed
      no phase and asked for no ``ctx.foreign_key``. Nothing of it exists
      anywhere, so it leaves nothing behind, as in the one-transaction mode;
      a retry runs it anew;
    - otherwise a 4xx that ``UNSTORED_STATUS_CODES`` lists (409, 404...) is
      stored as final all the same: the key cannot be forgotten (a phase
      committed, a foreign call may have happened), and keeping it pending
      would only have every retry refused again;
    - a :class:`Retry`, a 5xx or an exception of a request that is not
      pristine leaves the key pending, its lease released, for a retry or the
      completer to resume at the same recovery point.
    """

    def __init__(self, program: Phases, ctx: PhaseContext, request: IdempotentRequest,
                 token: int, fresh: bool, lease: timedelta, ttl: timedelta,
                 alias: str) -> None:
        self.program = program
        self.ctx = ctx
        self.request = request
        self.token = token
        self.fresh = fresh
        self.lease = lease
        self.ttl = ttl
        self.alias = alias
        self.advanced = False  # a phase of this run committed its recovery point

    @property
    def pristine(self) -> bool:
        return self.fresh and not self.advanced and not self.ctx.foreign_key_used

    def execute(
        self, on_exception: Callable[[Exception], StoredResponse | None] | None
    ) -> Result[StoredResponse]:
        try:
            while True:
                outcome = self._phase(on_exception)
                if outcome is None:
                    continue  # a phase committed its recovery point: the next one
                return outcome
        except LeaseLost:
            return Result(Outcome.IN_PROGRESS)
        except _Transient as transient:
            self._let_go()
            return Result(Outcome.EXECUTED, value=transient.response, verdict=Verdict.UNSTORED)
        except BaseException:
            self._let_go()
            raise

    def _phase(
        self, on_exception: Callable[[Exception], StoredResponse | None] | None
    ) -> Result[StoredResponse] | None:
        ctx, request, alias = self.ctx, self.request, self.alias
        transient = False
        with tenant_context(request.tenant_id, using=alias):
            try:
                # A savepoint: an exception's writes roll back before its
                # answer is stored (a returned Finish commits with them).
                with transaction.atomic(using=alias):
                    outcome = self.program.phase(ctx.recovery_point)(ctx)
            except Retry as exc:
                outcome, transient = exc.to_stored(), True
            except Exception as exc:
                converted = on_exception(exc) if on_exception else None
                if converted is None:
                    raise
                outcome = converted
            if isinstance(outcome, RecoveryPoint):
                ctx.state = {**ctx.state, **outcome.state}
                if not store.advance(alias, request, self.token, recovery_point=outcome.name,
                                     phase_state=ctx.state, lease=self.lease):
                    raise LeaseLost
                ctx.recovery_point = outcome.name
                self.advanced = True
                return None
            if isinstance(outcome, Finish):
                outcome = outcome.to_stored()
            if not isinstance(outcome, StoredResponse):
                raise TypeError(
                    f"phase {ctx.recovery_point!r} of {type(self.program).__qualname__} "
                    f"returned {outcome!r}; expected RecoveryPoint or Finish"
                )
            verdict = classify(outcome.status_code)
            if transient or outcome.status_code >= 500:
                raise _Transient(outcome)
            if verdict is Verdict.UNSTORED:
                if self.pristine:
                    raise _Transient(outcome)  # refused before anything happened: forget it
                verdict = Verdict.FAILED  # final: this key cannot be forgotten
            if not store.finish(alias, request, self.token, response=outcome,
                                state=verdict.value, phase_state=ctx.state, ttl=self.ttl):
                raise LeaseLost
            return Result(Outcome.EXECUTED, value=outcome, stored=outcome, verdict=verdict)

    def _let_go(self) -> None:
        forget_at = self.ctx.recovery_point if self.pristine else None
        _release(self.alias, self.request, self.token, forget_at)


class _Transient(Exception):
    def __init__(self, response: StoredResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


def _release(alias: str, request: IdempotentRequest, token: int, forget_at: str | None) -> None:
    """Let a retry resume at once; a no-op if the lease was already taken over.

    With ``forget_at``, the key is removed instead: the request is pristine
    (nothing committed, no foreign key handed out, never run before), so it is
    forgotten as if it had never come; a pending key would wait for a retry
    or a completer that may never come, or only be refused again. A request
    that is not pristine keeps its identity (``request_id``, hence
    ``ctx.foreign_key``) for its retry, since a foreign call may have happened.
    """
    try:
        with tenant_context(request.tenant_id, using=alias):
            if forget_at is None:
                store.release(alias, request, token)
            else:
                store.forget(alias, request, token, forget_at)
    except Exception:  # the original failure matters more; the lease will expire
        logger.warning(
            "could not release the lease of %s/%s/%s",
            request.tenant_id, request.scope, request.key, exc_info=True,
        )
