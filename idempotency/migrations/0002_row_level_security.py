from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("idempotency", "0001_initial")]

    operations = [
        RunSQLFile(
            "idempotency",
            "0002_row_level_security.sql",
            reverse="0002_row_level_security.reverse.sql",
        ),
    ]
