"""SQL kept in files inside a package: migrations' DDL, and the statements each app sends.

Two kinds of file, each read by one function here:

- ``<package>/sql/<NNNN_name>.sql``: what one migration runs (:func:`RunSQLFile`).
  Shipped SQL is never edited; a change is a new file and a new migration.
  Each file is used by exactly one migration (a test checks this).
- ``<package>/queries.sql``: every statement the app sends at run time, each
  once, under a name, with the reason it is hand-written beside it
  (:func:`queries`). Modules ask for a statement by name; none builds SQL.

A query file is a header (comment lines) and a sequence of blocks::

    -- name: lookup
    -- Why this statement is written by hand (one line or several).
    SELECT ... WHERE tenant_id = %(tenant_id)s

Parameters are psycopg's (``%(name)s`` or ``%s``); a literal percent sign is
``%%``. A block's trailing semicolon is dropped. Every block needs a name and
a reason; a name appears once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from types import MappingProxyType

from django.db import migrations
from django.db.migrations.operations.base import Operation

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def read_sql(package: str, name: str) -> str:
    """The text of ``<package>/sql/<name>``."""
    return resources.files(package).joinpath("sql", name).read_text(encoding="utf-8")


def RunSQLFile(  # noqa: N802
    package: str,
    name: str,
    reverse: str | None = None,
    state_operations: list[Operation] | None = None,
) -> migrations.RunSQL:
    """A ``RunSQL`` operation for ``<package>/sql/<name>``.

    Args:
        package: the package holding the ``sql/`` directory, e.g. ``"idempotency"``.
        name: the forward file.
        reverse: the file that undoes it, if the migration is reversible.
        state_operations: what the file does to the models, in Django's terms
            (e.g. a ``RemoveField`` for a column the file drops), so that the
            migration stays one operation.
    """
    return migrations.RunSQL(
        sql=read_sql(package, name),
        reverse_sql=read_sql(package, reverse) if reverse else None,
        state_operations=state_operations,
    )


def parse_queries(text: str, origin: str = "<queries>") -> dict[str, str]:
    """The named statements of a query file's ``text`` (see the module's docstring).

    Raises:
        ValueError: a statement before the first name, a block without a reason or a
            statement, or a name used twice.
    """
    parts = _NAME.split(text)
    if any(line.strip() and not line.startswith("--") for line in parts[0].splitlines()):
        raise ValueError(f"{origin}: a statement before the first '-- name:' line")
    found: dict[str, str] = {}
    for name, block in zip(parts[1::2], parts[2::2], strict=True):
        lines = block.strip().splitlines()
        reason = 0
        while reason < len(lines) and lines[reason].startswith("--"):
            reason += 1
        if not reason:
            raise ValueError(f"{origin}: {name} has no reason (a '--' line under its name)")
        statement = "\n".join(lines[reason:]).strip().removesuffix(";").strip()
        if not statement:
            raise ValueError(f"{origin}: {name} has no statement")
        if name in found:
            raise ValueError(f"{origin}: {name} is named twice")
        found[name] = statement
    return found


@cache
def queries(package: str) -> Mapping[str, str]:
    """The statements of ``<package>/queries.sql``, by name (read once per process)."""
    text = resources.files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    return MappingProxyType(parse_queries(text, f"{package}/queries.sql"))
