from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0008_tenant_fence")]

    operations = [
        RunSQLFile(
            "outbox", "0009_publish_function.sql", reverse="0009_publish_function.reverse.sql"
        ),
    ]
