from django.db import migrations

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("tenancy", "0001_verified_context")]

    operations = [
        RunSQLFile(
            "tenancy", "0002_tenant_isolation.sql", reverse="0002_tenant_isolation.reverse.sql"
        ),
    ]
