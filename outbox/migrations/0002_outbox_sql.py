from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0001_initial")]

    operations = [
        RunSQLFile("outbox", "0002_outbox.sql", reverse="0002_outbox.reverse.sql"),
    ]
