from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("testapp", "0003_payment")]

    operations = [RunSQLFile("tests.testapp", "0004_payment_rls.sql")]
