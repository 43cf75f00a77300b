"""Migrations that run SQL kept in ``.sql`` files inside a package.

Shipped SQL is never edited; a change is a new file and a new migration.
Each file is used by exactly one migration (a test checks this).
"""

from __future__ import annotations

from importlib import resources

from django.db import migrations
from django.db.migrations.operations.base import Operation


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
