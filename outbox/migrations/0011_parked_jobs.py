# The re-drive and discard jobs (outbox.deadletters), and when a re-drive last
# failed on a dead letter (its parked_at stays when it was parked). Plain
# Django: the jobs table names tenants but holds none of their rows.

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('outbox', '0010_database_marks'),
    ]

    operations = [
        migrations.CreateModel(
            name='ParkedJob',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('action', models.CharField(choices=[('redrive', 're-drive'), ('discard', 'discard')], max_length=16)),
                ('consumer', models.CharField(max_length=200, null=True)),
                ('topic', models.CharField(max_length=200, null=True)),
                ('tenants', models.JSONField(null=True)),
                ('search', models.CharField(blank=True, default='', max_length=200)),
                ('rows', models.JSONField(null=True)),
                ('upto_id', models.BigIntegerField()),
                ('requested_by', models.CharField(max_length=200)),
                ('user_id', models.IntegerField(null=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('state', models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'), ('done', 'Done'), ('failed', 'Failed')], default='queued', max_length=16)),
                ('total', models.IntegerField(default=0)),
                ('handled', models.IntegerField(default=0)),
                ('failed', models.IntegerField(default=0)),
                ('missing', models.IntegerField(default=0)),
                ('after_tenant_id', models.BigIntegerField(default=-1)),
                ('after_id', models.BigIntegerField(default=0)),
                ('lease_owner', models.CharField(blank=True, default='', max_length=200)),
                ('lease_until', models.DateTimeField(null=True)),
                ('started_at', models.DateTimeField(null=True)),
                ('finished_at', models.DateTimeField(null=True)),
                ('last_error', models.TextField(blank=True, default='')),
            ],
            options={
                'verbose_name': 're-drive or discard job',
                'db_table': 'outbox_parked_jobs',
                'ordering': ['-id'],
            },
        ),
        migrations.AddField(
            model_name='deadletter',
            name='redrive_failed_at',
            field=models.DateTimeField(null=True),
        ),
    ]
