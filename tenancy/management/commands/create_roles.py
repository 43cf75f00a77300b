from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_idempotency_outbox.errors import ConfigurationError


class Command(BaseCommand):
    help = (
        "Create the four roles (owner, app, worker, system) and the database that the settings "
        "name, from a superuser's connection; alter a role whose attributes or settings differ "
        "from what the design requires (TENANCY[\"ROLE_SETTINGS\"]). Running it again changes "
        "nothing. --print shows the SQL instead. "
        "No password is shown: new roles' passwords come from the settings or are written to "
        "the aliases' password file."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--superuser-url", metavar="URL",
            help="a libpq URL or connection string that logs in as a superuser (default: the "
            "owner alias's host and port, user postgres, database postgres; a password from "
            "PGPASSWORD or ~/.pgpass)",
        )
        parser.add_argument(
            "--database", default="owner", metavar="ALIAS",
            help="the alias that logs in as the owner; its NAME is the database (default: owner)",
        )
        parser.add_argument(
            "--print", action="store_true", dest="print_only",
            help="print the SQL for a new server instead of running anything (no connection); "
            "the notes go to stderr, so it can be piped into psql",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        import psycopg

        from tenancy import provision

        try:
            goal = provision.target(options["database"])
            if options["print_only"]:
                sql, notes = provision.script(goal)
                for note in notes:
                    self.stderr.write(f"-- {note}")
                self.stdout.write("\n".join(sql))
                return
            conn = provision.superuser_connection(goal, options["superuser_url"])
            with conn:
                result = provision.provision(goal, conn)
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        except psycopg.Error as exc:
            raise CommandError(str(exc).strip().splitlines()[0]) from exc
        for step in result.steps:
            if step.message:  # a difference put back by two statements says so once
                self.stdout.write(step.message)
        for warning in result.warnings:
            self.stderr.write(f"warning: {warning}")
        if result.error:
            raise CommandError(result.error)
        if not result.changes:
            self.stdout.write("nothing to change")
