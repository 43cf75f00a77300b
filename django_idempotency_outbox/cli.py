"""Argument types shared by the library's management commands."""

from __future__ import annotations

import argparse
import uuid
from datetime import datetime


def positive_int(value: str) -> int:
    """An int of at least 1 (e.g. ``--batch-size``)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return number


def port_number(value: str) -> int:
    """A TCP port, 1 to 65535 (e.g. ``--metrics-port``)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (1 to 65535)")
    return number


def serve_metrics(port: int | None, addr: str = "0.0.0.0") -> None:
    """Start ``--metrics-port``'s server (nothing when ``port`` is None).

    Raises:
        CommandError: metrics are unavailable, or the port cannot be bound.
    """
    if port is None:
        return
    from django.core.management.base import CommandError

    from django_idempotency_outbox import metrics

    try:
        metrics.serve(port, addr)
    except RuntimeError as exc:
        raise CommandError(f"--metrics-port: {exc}") from exc
    except OSError as exc:
        reason = exc.strerror or exc
        raise CommandError(f"--metrics-port: cannot listen on {addr}:{port}: {reason}") from exc


def non_negative_seconds(value: str) -> float:
    """A number of seconds, 0 or more (e.g. ``--older-than``)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if number < 0 or number != number:  # NaN compares unequal to itself
        raise argparse.ArgumentTypeError(f"{value} is not a number of seconds, 0 or more")
    return number


def message_id_or_time(value: str) -> uuid.UUID | datetime:
    """A message id (a UUID) or an ISO 8601 time with a time zone (e.g. ``--rewind-to``)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither a message id (a UUID) nor an ISO 8601 time "
            "(e.g. 2026-11-23T08:00:00+00:00)"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} has no time zone; add one (e.g. {value}+00:00, or Z for UTC)"
        )
    return when
