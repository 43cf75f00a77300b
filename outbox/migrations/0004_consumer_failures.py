import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("outbox", "0003_publisher_fence")]

    operations = [
        migrations.CreateModel(
            name="ConsumerFailure",
            fields=[
                ("pk", models.CompositePrimaryKey("tenant_id", "consumer", "partition", blank=True, editable=False, primary_key=True, serialize=False)),
                ("tenant_id", models.BigIntegerField()),
                ("consumer", models.CharField(max_length=200)),
                ("partition", models.IntegerField()),
                ("message_pk", models.BigIntegerField()),
                ("message_id", models.UUIDField()),
                ("attempts", models.IntegerField()),
                ("error", models.TextField()),
                ("failed_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={"db_table": "outbox_consumer_failures"},
        ),
    ]
