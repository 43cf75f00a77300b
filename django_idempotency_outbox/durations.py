"""Durations and backoff, one rule each for the whole library.

Every duration the library accepts (a setting, a view attribute, a program's
lease) is a :class:`~datetime.timedelta` or a number of seconds, and goes
through :func:`as_timedelta`; every growing pause (database outages, broker
outages, consumer retries, waiting for a request in flight) is
:func:`backoff`.
"""

from __future__ import annotations

from datetime import timedelta


def as_timedelta(value: object, name: str, *, allow_zero: bool = False) -> timedelta:
    """``value`` as a timedelta; refuse anything that is not a duration.

    Args:
        value: a ``timedelta``, or an int or float of seconds (not a bool, not
            a string: ``"1h"`` is refused rather than guessed at).
        name: how the caller calls it, for the error message
            (``'IDEMPOTENCY["TTL"]'``).
        allow_zero: accept a zero duration (a pause may be zero; a lifetime
            may not). Negative durations are always refused.

    Raises:
        TypeError: not a timedelta or a number.
        ValueError: negative, or zero when ``allow_zero`` is false.
    """
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = timedelta(seconds=value)
    else:
        raise TypeError(f"{name} must be a timedelta or a number of seconds, not {value!r}")
    if result < timedelta(0) or (result == timedelta(0) and not allow_zero):
        rule = "not negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be {rule}, not {value!r}")
    return result


def as_seconds(value: object, name: str, *, allow_zero: bool = True) -> float:
    """As :func:`as_timedelta`, in seconds (zero allowed by default)."""
    return as_timedelta(value, name, allow_zero=allow_zero).total_seconds()


def backoff(attempt: int, first: float, maximum: float) -> float:
    """The pause before retry number ``attempt`` (1, 2, ...): doubling from ``first``.

    ``first * 2 ** (attempt - 1)``, never more than ``maximum``. Computed
    without overflow for any number of attempts.
    """
    if attempt < 1 or first <= 0:
        return 0.0 if first <= 0 else first
    if attempt > 64:  # 2**64 times anything positive is past any maximum
        return maximum
    return float(min(first * 2 ** (attempt - 1), maximum))
