from django.db import migrations, models

from django_idempotency_outbox.sqlfiles import RunSQLFile


class Migration(migrations.Migration):
    dependencies = [("outbox", "0007_verified_context_policy")]

    operations = [
        RunSQLFile(
            "outbox",
            "0008_tenant_fence.sql",
            reverse="0008_tenant_fence.reverse.sql",
            state_operations=[
                migrations.AddField("consumeroffset", "held", models.JSONField(default=dict)),
            ],
        ),
    ]
