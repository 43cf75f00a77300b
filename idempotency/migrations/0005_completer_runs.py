from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("idempotency", "0004_admin_list")]

    operations = [
        migrations.AddField(
            model_name="idempotencykey",
            name="completer_runs",
            field=models.IntegerField(db_default=0),
        ),
    ]
