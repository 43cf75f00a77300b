from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0012_one_scan_read")]

    operations = [
        RunSQLFile(
            "outbox", "0013_publishers_hashed.sql", reverse="0013_publishers_hashed.reverse.sql"
        ),
    ]
