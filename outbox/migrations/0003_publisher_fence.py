from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0002_outbox_sql")]

    operations = [
        # Irreversible: a position in id order has no exact (xid, id) equivalent.
        RunSQLFile(
            "outbox",
            "0003_publisher_fence.sql",
            state_operations=[migrations.RemoveField("consumeroffset", "last_xid")],
        ),
    ]
