from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("idempotency", "0005_completer_runs"), ("tenancy", "0001_verified_context")]

    operations = [
        RunSQLFile(
            "idempotency",
            "0006_verified_context_policy.sql",
            reverse="0006_verified_context_policy.reverse.sql",
        ),
    ]
