"""(Re)create the demo database as the owner role and migrate it (which grants the roles)."""

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Drop and create the demo database as the owner, migrate (and so grant) as the owner."

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
        # migrate, run as the owner, applies the library's privileges and, with
        # TENANCY["GRANT_PROJECT_TABLES"], the shop's (docs/roles.md).
        call_command("migrate", database="owner", verbosity=0)
        self.stdout.write(f"database {name}: migrated as {owner['USER']}, roles granted")
