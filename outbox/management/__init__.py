"""What the outbox's commands share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.db import DatabaseError


@contextmanager
def one_line_errors(prefix: str = "", also: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """A setting or alias that cannot work, or a database that cannot be read (or an
    error of ``also``), as a ``CommandError`` of one line: exit 1, no traceback."""
    errors: tuple[type[Exception], ...] = (ImproperlyConfigured, DatabaseError, *also)
    try:
        yield
    except errors as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CommandError(prefix + first) from exc
