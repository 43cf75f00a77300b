from django.db import migrations, models


class Migration(migrations.Migration):
    """The benchmark's autocommit baseline gets Order's tenant column and index (no RLS)."""

    dependencies = [
        ("testapp", "0004_payment_rls"),
    ]

    operations = [
        migrations.AddField(
            model_name="plainorder",
            name="tenant_id",
            field=models.BigIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.AddIndex(
            model_name="plainorder",
            index=models.Index(fields=["tenant_id", "sku"], name="testapp_plain_order_tenant_sku"),
        ),
    ]
