from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("shop", "0001_initial")]

    operations = [RunSQLFile("example_project.shop", "0002_row_level_security.sql")]
