from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0011_parked_jobs")]

    operations = [
        RunSQLFile("outbox", "0012_one_scan_read.sql", reverse="0012_one_scan_read.reverse.sql"),
    ]
