"""Typed settings: converted once, refused by ``manage.py check`` when wrong."""

from datetime import timedelta

import pytest
from django.core import checks

from django_idempotency_outbox.conf import registered
from django_idempotency_outbox.durations import as_timedelta, backoff
from django_idempotency_outbox.errors import ConfigurationError, IdempotencyOutboxError
from idempotency.conf import idempotency_settings
from outbox.conf import outbox_settings
from tenancy.conf import tenancy_settings


def test_every_app_registers_its_settings():
    names = {s.namespace for s in registered()}
    assert {"TENANCY", "IDEMPOTENCY", "OUTBOX"} <= names


@pytest.mark.parametrize("app_settings", [tenancy_settings, idempotency_settings, outbox_settings])
def test_every_default_passes_its_own_converter(app_settings):
    for key, setting in type(app_settings)._declared.items():
        setting.convert(setting.default, app_settings.label(key))


def test_values_are_converted_once_to_their_type(settings):
    settings.IDEMPOTENCY = {"TTL": 90, "UNSTORED_STATUS_CODES": [401, 409]}
    assert idempotency_settings.TTL == timedelta(seconds=90)
    assert idempotency_settings.UNSTORED_STATUS_CODES == frozenset({401, 409})
    settings.OUTBOX = {**settings.OUTBOX, "RELAY_LEASE": timedelta(seconds=3)}
    assert outbox_settings.RELAY_LEASE == 3.0


def test_a_new_settings_dict_takes_effect_at_once(settings):
    settings.IDEMPOTENCY = {"TTL": 5}
    assert idempotency_settings.TTL == timedelta(seconds=5)
    settings.IDEMPOTENCY = {"TTL": 7}
    assert idempotency_settings.TTL == timedelta(seconds=7)


@pytest.mark.parametrize(
    ("namespace", "key", "value"),
    [
        ("IDEMPOTENCY", "TTL", "1h"),
        ("IDEMPOTENCY", "TTL", 0),
        ("IDEMPOTENCY", "REQUIRED", "yes"),
        ("IDEMPOTENCY", "STATUS_MISMATCH", 1000),
        ("IDEMPOTENCY", "UNSTORED_STATUS_CODES", "409"),
        ("IDEMPOTENCY", "MAX_KEY_LENGTH", 0),
        ("OUTBOX", "CONSUMER_BATCH_SIZE", 0),
        ("OUTBOX", "RETRY_BACKOFF", -1),
        ("OUTBOX", "CELERY_TOPIC_TASKS", {"order.paid": 3}),
        ("TENANCY", "APP_DATABASE", ""),
    ],
)
def test_a_bad_value_is_a_check_error_naming_the_key(settings, namespace, key, value):
    setattr(settings, namespace, {**getattr(settings, namespace, {}), key: value})
    errors = [m for m in checks.run_checks() if m.id == "tenancy.E007"]
    assert [m.msg for m in errors if f'{namespace}["{key}"]' in m.msg], errors
    app_settings = {s.namespace: s for s in registered()}[namespace]
    with pytest.raises(ConfigurationError, match=key):
        getattr(app_settings, key)


def test_configuration_errors_share_the_library_base_and_djangos():
    from django.core.exceptions import ImproperlyConfigured

    assert issubclass(ConfigurationError, IdempotencyOutboxError)
    assert issubclass(ConfigurationError, ImproperlyConfigured)


def test_one_duration_rule():
    assert as_timedelta(2.5, "x") == timedelta(seconds=2.5)
    assert as_timedelta(0, "x", allow_zero=True) == timedelta(0)
    with pytest.raises(ValueError, match="positive"):
        as_timedelta(0, "x")
    with pytest.raises(ValueError, match="not negative"):
        as_timedelta(-1, "x", allow_zero=True)
    with pytest.raises(TypeError):
        as_timedelta(True, "x")


def test_one_backoff_doubles_up_to_its_maximum():
    assert [backoff(n, 0.5, 3.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff(10_000, 1.0, 30.0) == 30.0
    assert backoff(3, 0.0, 30.0) == 0.0
