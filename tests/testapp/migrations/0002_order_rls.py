from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("testapp", "0001_initial")]

    operations = [RunSQLFile("tests.testapp", "0002_order_rls.sql")]
