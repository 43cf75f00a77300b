from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        RunSQLFile(
            "tenancy", "0001_verified_context.sql", reverse="0001_verified_context.reverse.sql"
        ),
    ]
