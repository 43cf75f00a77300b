from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("idempotency", "0009_pending_index")]

    operations = [
        RunSQLFile("idempotency", "0010_autovacuum.sql", reverse="0010_autovacuum.reverse.sql"),
    ]
