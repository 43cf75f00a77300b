from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0009_publish_function")]

    operations = [
        RunSQLFile(
            "outbox",
            "0010_database_marks.sql",
            reverse="0010_database_marks.reverse.sql",
        ),
    ]
