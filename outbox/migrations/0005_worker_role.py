from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0004_consumer_failures")]

    operations = [
        RunSQLFile(
            "outbox",
            "0005_worker_role.sql",
            reverse="0005_worker_role.reverse.sql",
            state_operations=[migrations.RemoveField("consumeroffset", "last_error")],
        ),
    ]
