"""(Re)create the demo database as the owner role, migrate it, grant the roles."""

from pathlib import Path

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connections

from tenancy.aliases import app_alias, system_alias

GRANTS = Path(__file__).resolve().parents[2] / "sql" / "grants.sql"


class Command(BaseCommand):
    help = "Drop and create the demo database as the owner, migrate as the owner, grant."

    def handle(self, *args, **options):
        owner = settings.DATABASES["owner"]
        name = owner["NAME"]
        dsn = (
            f"host={owner['HOST']} port={owner['PORT']} user={owner['USER']} "
            f"password={owner['PASSWORD']} dbname=postgres"
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        call_command("migrate", database="owner", verbosity=0)
        with connections["owner"].cursor() as cursor:
            cursor.execute(
                GRANTS.read_text().format(
                    app=settings.DATABASES[app_alias()]["USER"],
                    system=settings.DATABASES[system_alias()]["USER"],
                )
            )
        self.stdout.write(f"database {name}: migrated as {owner['USER']}, roles granted")
