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


#: Each app reports its own dict under its own ids (docs/settings.md).
INVALID = {"TENANCY": "tenancy.E007", "OBSERVABILITY": "tenancy.E007",
           "IDEMPOTENCY": "idempotency.E090", "OUTBOX": "outbox.E090"}
UNKNOWN = {"TENANCY": "tenancy.E002", "OBSERVABILITY": "tenancy.E002",
           "IDEMPOTENCY": "idempotency.E091", "OUTBOX": "outbox.E091"}
REMOVED = UNKNOWN  # the same id, a message naming what replaces the key
NOT_A_DICT = {"TENANCY": "tenancy.E001", "OBSERVABILITY": "tenancy.E001",
              "IDEMPOTENCY": "idempotency.E090", "OUTBOX": "outbox.E090"}


@pytest.mark.parametrize("app_settings", registered(), ids=lambda s: s.namespace)
def test_a_removed_key_is_reported_with_what_replaces_it(settings, app_settings):
    """Under its app's id, naming the replacement; never as an unknown key."""
    namespace = app_settings.namespace
    if not app_settings.removed:
        pytest.skip(f"{namespace} has no removed key")
    for key, replacement in app_settings.removed.items():
        setattr(settings, namespace, {**getattr(settings, namespace, {}), key: 1})
        found = checks.run_checks()
        removed = [m for m in found if m.id == REMOVED[namespace] and f'["{key}"]' in m.msg]
        assert len(removed) == 1, found
        assert replacement in removed[0].msg and "was removed" in removed[0].msg
        assert not [m for m in found if m.msg == f"Unknown setting {namespace}[{key!r}]."]


@pytest.mark.parametrize("namespace", ["TENANCY", "IDEMPOTENCY", "OUTBOX", "OBSERVABILITY"])
def test_an_unknown_key_or_a_dict_that_is_not_one_is_reported_by_its_app(settings, namespace):
    setattr(settings, namespace, {**getattr(settings, namespace, {}), "NO_SUCH_KEY": 1})
    found = checks.run_checks()
    assert [m.id for m in found if "NO_SUCH_KEY" in m.msg] == [UNKNOWN[namespace]]
    setattr(settings, namespace, ["not", "a", "dict"])
    found = checks.run_checks()
    assert [m.id for m in found if m.msg == f"settings.{namespace} must be a dict."] == [
        NOT_A_DICT[namespace]]


@pytest.mark.parametrize(
    ("namespace", "key", "value"),
    [
        ("IDEMPOTENCY", "TTL", "1h"),
        ("IDEMPOTENCY", "TTL", 0),
        ("IDEMPOTENCY", "REQUIRED", "yes"),
        ("IDEMPOTENCY", "STATUS_MISMATCH", 1000),
        ("IDEMPOTENCY", "UNSTORED_STATUS_CODES", "409"),
        ("IDEMPOTENCY", "COMPLETE_MAX_ATTEMPTS", 0),
        ("OUTBOX", "POLL_INTERVAL", -1),
        ("OUTBOX", "CELERY_TASK", {"order.paid": 3}),
        ("OUTBOX", "RETENTION", "7d"),
        ("TENANCY", "APP_DATABASE", ""),
    ],
)
def test_a_bad_value_is_a_check_error_naming_the_key(settings, namespace, key, value):
    setattr(settings, namespace, {**getattr(settings, namespace, {}), key: value})
    errors = [m for m in checks.run_checks() if m.id == INVALID[namespace]]
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
