from __future__ import annotations

from pathlib import Path
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.loader import MigrationLoader

from outbox.management import one_line_errors


class Command(BaseCommand):
    help = (
        "Write a migration into APP_LABEL that lets Debezium read outbox_messages: a "
        "publication of its inserts and SELECT for the connector's role (which a superuser "
        "creates with LOGIN REPLICATION). Review it, commit it, run migrate as the owner; "
        "migrating APP_LABEL back undoes it (docs/debezium.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("app_label", help="the app of your project that gets the migration")
        parser.add_argument("--publication", default="outbox",
                            help="the publication's name (default: outbox; the connector's "
                            "publication.name)")
        parser.add_argument("--role", default="outbox_connector",
                            help="the connector's role (default: outbox_connector)")
        parser.add_argument("--name", default="debezium_outbox",
                            help="the migration's name after its number (default: "
                            "debezium_outbox)")
        parser.add_argument("--dry-run", action="store_true",
                            help="print the migration instead of writing it")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox import debezium

        label = options["app_label"]
        try:
            config = apps.get_app_config(label)
        except LookupError as exc:
            raise CommandError(f"no installed app is labelled {label!r}") from exc
        if config.label == "outbox":
            raise CommandError("the migration belongs to an app of your project, not to outbox")
        loader = MigrationLoader(connections[DEFAULT_DB_ALIAS], ignore_no_migrations=True)
        module, _ = loader.migrations_module(label)
        if module is None:
            raise CommandError(f"{label} has no migrations module")
        dependencies = sorted(loader.graph.leaf_nodes("outbox") + loader.graph.leaf_nodes(label))
        numbers = [int(name[:4]) for app, name in loader.graph.nodes
                   if app == label and name[:4].isdigit()]
        filename = f"{max(numbers, default=0) + 1:04d}_{options['name']}.py"
        with one_line_errors(also=(ValueError,)):
            source = debezium.migration_source(dependencies, options["publication"],
                                               options["role"])
        if options["dry_run"]:
            self.stdout.write(source)
            return
        directory = Path(config.path) / "migrations"
        if module != f"{config.name}.migrations" or not directory.is_dir():
            raise CommandError(f"{label}'s migrations are not in {directory}; use --dry-run "
                               "and save the migration yourself")
        path = directory / filename
        path.write_text(source, encoding="utf-8")
        self.stdout.write(f"wrote {path}")
        self.stdout.write(
            f"before migrate, as a superuser: CREATE ROLE {options['role']} LOGIN REPLICATION "
            "PASSWORD '...';"
        )
