"""Argument types shared by the library's management commands."""

from __future__ import annotations

import argparse


def positive_int(value: str) -> int:
    """An int of at least 1 (e.g. ``--batch-size``)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return number


def non_negative_seconds(value: str) -> float:
    """A number of seconds, 0 or more (e.g. ``--older-than``)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if number < 0 or number != number:  # NaN compares unequal to itself
        raise argparse.ArgumentTypeError(f"{value} is not a number of seconds, 0 or more")
    return number
