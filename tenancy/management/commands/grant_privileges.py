from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError


class Command(BaseCommand):
    help = (
        "Apply the library's privileges (tenancy.privileges.matrix()) to the app, worker and "
        "system roles, as the tables' owner: REVOKE what the matrix does not give, then GRANT "
        "what it does; and take TEMPORARY on the database away from the app and worker roles "
        "(as the database's owner). migrate run as the owner does the same; --print shows the SQL."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default="owner",
            help="the alias that logs in as the tables' owner (default: owner)",
        )
        parser.add_argument(
            "--print", action="store_true", dest="print_only",
            help="print the statements instead of running them (no connection needed)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from tenancy import privileges

        if options["print_only"]:
            for line in privileges.statements():
                self.stdout.write(line)
            # the database's privileges: its owner runs these (docs/roles.md)
            for line in privileges.database_statements():
                self.stdout.write(line)
            return
        alias = options["database"]
        if alias not in settings.DATABASES:
            raise CommandError(
                f"database alias {alias!r} is not in DATABASES: name the alias that logs in as "
                "the tables' owner with --database"
            )
        missing = [k for k in privileges.KINDS if k not in privileges.role_names()]
        try:
            if not privileges.owns_tables(alias):
                raise CommandError(
                    f"database alias {alias!r} does not connect as the owner of the library's "
                    "tables (or they are not migrated yet): only the owner can grant them"
                )
            run = privileges.apply(alias)
            database = privileges.apply_database(alias)
        except DatabaseError as exc:
            raise CommandError(f"could not grant: {str(exc).strip()}") from exc
        self.stdout.write(f"applied {len(run) + len(database or ())} statement(s) on {alias!r}")
        if database is None:
            self.stdout.write(
                f"{alias!r} does not connect as the database's owner, so the app and worker "
                "roles keep TEMPORARY; its owner should run: "
                + " ".join(privileges.database_statements())
            )
        for kind in missing:
            self.stdout.write(f"no {kind} role configured: its grants were left out")
