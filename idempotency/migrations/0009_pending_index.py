from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built without locking the table's writes (CREATE INDEX CONCURRENTLY),
    # which cannot run in a transaction.
    atomic = False

    dependencies = [("idempotency", "0008_request_functions")]

    operations = [
        AddIndexConcurrently(
            model_name="idempotencykey",
            index=models.Index(
                fields=["tenant_id", "created_at"], condition=models.Q(state="pending"),
                name="idempotency_keys_pending",
            ),
        ),
    ]
