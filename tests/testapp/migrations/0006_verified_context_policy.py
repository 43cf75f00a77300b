from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("testapp", "0005_plain_order_like_order"), ("tenancy", "0001_verified_context")]

    operations = [RunSQLFile("tests.testapp", "0005_verified_context_policy.sql")]
