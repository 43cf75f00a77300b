from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("idempotency", "0005_completer_runs")]

    operations = [
        RunSQLFile("idempotency", "0006_leases.sql", reverse="0006_leases.reverse.sql"),
    ]
