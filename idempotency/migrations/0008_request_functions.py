from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("idempotency", "0007_verified_context_policy")]

    operations = [
        RunSQLFile(
            "idempotency",
            "0008_request_functions.sql",
            reverse="0008_request_functions.reverse.sql",
        ),
    ]
