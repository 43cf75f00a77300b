# The admin's unmanaged views of two tables (no SQL: managed = False).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('outbox', '0005_worker_role'),
    ]

    operations = [
        migrations.CreateModel(
            name='ParkedMessageRecord',
            fields=[
                ('tenant_id', models.BigIntegerField()),
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('consumer', models.CharField(max_length=200)),
                ('message_pk', models.BigIntegerField()),
                ('message_id', models.UUIDField()),
                ('topic', models.CharField(max_length=200)),
                ('key', models.CharField(max_length=200, null=True)),
                ('attempts', models.IntegerField()),
                ('error', models.TextField()),
                ('message_created_at', models.DateTimeField()),
                ('parked_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'parked message',
                'db_table': 'outbox_dead_letters',
                'ordering': ['parked_at', 'tenant_id', 'id'],
                'managed': False,
            },
        ),
        migrations.CreateModel(
            name='ReaderPositionRecord',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('partition', models.IntegerField()),
                ('partition_count', models.IntegerField()),
                ('last_id', models.BigIntegerField()),
                ('last_processed_at', models.DateTimeField(null=True)),
                ('attempts', models.IntegerField()),
                ('lease_owner', models.CharField(max_length=200)),
                ('lease_until', models.DateTimeField(null=True)),
            ],
            options={
                'verbose_name': 'reader position',
                'db_table': 'consumer_offsets',
                'ordering': ['name', 'partition'],
                'managed': False,
            },
        ),
    ]
