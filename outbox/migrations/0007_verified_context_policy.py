from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0006_admin_lists"), ("tenancy", "0001_verified_context")]

    operations = [
        RunSQLFile(
            "outbox",
            "0007_verified_context_policy.sql",
            reverse="0007_verified_context_policy.reverse.sql",
        ),
    ]
