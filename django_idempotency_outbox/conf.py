"""Typed, namespaced settings, read live and validated once.

Each app declares one :class:`AppSettings` subclass whose :class:`Setting` attributes are the
keys of its settings dict, with their defaults and converters. A value is converted the first
time it is read and kept until Django's ``setting_changed`` (as DRF's settings are), so
``override_settings`` works and mutating the dict in place does not; :func:`check` reports a
value that cannot be converted, or a removed key with what replaces it (docs/settings.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import MappingProxyType
from typing import Any, ClassVar, Generic, TypeVar, overload

from django.conf import settings
from django.core import checks
from django.core.signals import setting_changed

from django_idempotency_outbox.durations import as_seconds, as_timedelta
from django_idempotency_outbox.errors import ConfigurationError

T = TypeVar("T")

#: Turns a user's value into the setting's type; raises TypeError or
#: ValueError (with a message naming ``label``) when it cannot.
Converter = Callable[[Any, str], T]


class Setting(Generic[T]):
    """One key of an app's settings dict: its default, written as a user would write it (it
    goes through the same converter), and its converter."""

    def __init__(self, default: Any, convert: Converter[T] | None = None) -> None:
        self.default = default
        self.convert: Converter[T] = convert or _as_is
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, obj: AppSettings, owner: type | None = None) -> T: ...

    def __get__(self, obj: AppSettings | None, owner: type | None = None) -> T | Setting[T]:
        if obj is None:
            return self
        return obj.value(self.key)  # type: ignore[no-any-return]


def _as_is(value: Any, label: str) -> Any:
    return value


class AppSettings:
    """Base class of an app's settings object (one instance per app): a :attr:`namespace` (the
    name of the dict in ``django.conf.settings``) and :class:`Setting` attributes."""

    namespace: ClassVar[str] = ""
    #: Keys earlier releases had, each with what replaces it (a sentence).
    removed: ClassVar[dict[str, str]] = {}
    _declared: ClassVar[dict[str, Setting[Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared: dict[str, Setting[Any]] = {}
        for base in reversed(cls.__mro__):
            declared.update({k: v for k, v in vars(base).items() if isinstance(v, Setting)})
        cls._declared = declared

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        _registry.append(self)

    @property
    def name(self) -> str:
        return self.namespace

    @property
    def defaults(self) -> dict[str, Any]:
        """Every key with its default."""
        return {key: setting.default for key, setting in self._declared.items()}

    def label(self, key: str) -> str:
        """How the docs and error messages name a key: ``IDEMPOTENCY["TTL"]``."""
        return f'{self.namespace}["{key}"]'

    def user_settings(self) -> Mapping[str, Any]:
        """The dict in ``django.conf.settings`` ({} when absent; ConfigurationError: not a dict)."""
        value = getattr(settings, self.namespace, _NO_SETTINGS)
        if not isinstance(value, Mapping):
            raise ConfigurationError(f"settings.{self.namespace} must be a dict.")
        return value

    def value(self, key: str) -> Any:
        """The converted value of ``key`` (the default when the user gave none), kept until the
        settings change; ConfigurationError when the user's value cannot be converted."""
        if key in self._values:
            return self._values[key]
        setting = self._declared.get(key)
        if setting is None:
            raise AttributeError(f"{self.namespace} has no setting {key!r}")
        source = self.user_settings()
        raw = source[key] if key in source else setting.default
        try:
            converted = setting.convert(raw, self.label(key))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from exc
        self._values[key] = converted
        return converted

    def reload(self) -> None:
        """Forget the converted values: the next read converts the settings again."""
        self._values = {}

    def unknown_keys(self) -> list[str]:
        """Keys of the user's dict that this app does not know (typos), removed ones aside."""
        return sorted(set(self.user_settings()) - set(self._declared) - set(self.removed))

    def removed_keys(self) -> dict[str, str]:
        """Keys of the user's dict that a release removed, each with what replaces it."""
        return {key: self.removed[key] for key in sorted(self.user_settings())
                if key in self.removed}

    def invalid_keys(self) -> dict[str, str]:
        """Each key whose value cannot be converted, with the reason."""
        problems: dict[str, str] = {}
        for key, raw in self.user_settings().items():
            setting = self._declared.get(key)
            if setting is None:
                continue
            try:
                setting.convert(raw, self.label(key))
            except (TypeError, ValueError) as exc:
                problems[key] = str(exc)
        return problems

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.namespace}>"


_NO_SETTINGS: Mapping[str, Any] = MappingProxyType({})

#: Every settings object, so that one system check covers them all.
_registry: list[AppSettings] = []


def reload_settings(*, setting: str, **kwargs: Any) -> None:
    """``setting_changed``: forget the converted values of the namespace that changed."""
    for app_settings in _registry:
        if app_settings.namespace == setting:
            app_settings.reload()


setting_changed.connect(reload_settings)


def registered() -> list[AppSettings]:
    """The settings objects of the apps imported so far."""
    return list(_registry)


@dataclass(frozen=True)
class CheckIds:
    """The check ids under which an app reports its own settings dict."""

    not_a_dict: str
    unknown: str
    invalid: str
    removed: str


def check(app_settings: AppSettings, ids: CheckIds) -> list[checks.CheckMessage]:
    """``manage.py check``'s findings about one settings dict, under its app's ids."""
    try:
        unknown = app_settings.unknown_keys()
        removed = app_settings.removed_keys()
        invalid = app_settings.invalid_keys()
    except ConfigurationError as exc:  # not a dict
        return [checks.Error(str(exc), id=ids.not_a_dict)]
    errors: list[checks.CheckMessage] = [
        checks.Error(
            f"Unknown setting {app_settings.name}[{key!r}].",
            hint=f"Known settings: {', '.join(sorted(app_settings.defaults))}.",
            id=ids.unknown,
        )
        for key in unknown
    ]
    errors.extend(
        checks.Error(
            f"{app_settings.label(key)} was removed: {replacement}",
            hint="Remove the key (docs/settings.md, \"Removed settings\").",
            id=ids.removed,
        )
        for key, replacement in removed.items()
    )
    errors.extend(
        checks.Error(
            f"Invalid setting {app_settings.label(key)}: {problem}",
            hint="docs/settings.md lists each setting's type and default.",
            id=ids.invalid,
        )
        for key, problem in sorted(invalid.items())
    )
    return errors


def duration(*, allow_zero: bool = False) -> Converter[timedelta]:
    """A timedelta, or a number of seconds."""

    def convert(value: Any, label: str) -> timedelta:
        return as_timedelta(value, label, allow_zero=allow_zero)

    return convert


def seconds(*, allow_zero: bool = True) -> Converter[float]:
    """A number of seconds, given as seconds or as a timedelta."""

    def convert(value: Any, label: str) -> float:
        return as_seconds(value, label, allow_zero=allow_zero)

    return convert


def boolean(value: Any, label: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{label} must be True or False, not {value!r}")
    return value


def integer(*, minimum: int | None = None, maximum: int | None = None) -> Converter[int]:
    """An int (not a bool) within the bounds."""

    def convert(value: Any, label: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{label} must be an int, not {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"{label} must be at least {minimum}, not {value!r}")
        if maximum is not None and value > maximum:
            raise ValueError(f"{label} must be at most {maximum}, not {value!r}")
        return value

    return convert


http_status = integer(minimum=100, maximum=599)


def http_statuses(value: Any, label: str) -> frozenset[int]:
    """A collection of HTTP status codes."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | set | frozenset):
        raise TypeError(f"{label} must be a list of HTTP status codes, not {value!r}")
    return frozenset(http_status(code, label) for code in value)


def text(*, empty: bool = False, max_length: int | None = None) -> Converter[str]:
    def convert(value: Any, label: str) -> str:
        if not isinstance(value, str):
            raise TypeError(f"{label} must be a string, not {value!r}")
        if not empty and not value.strip():
            raise ValueError(f"{label} must not be empty")
        if max_length is not None and len(value) > max_length:
            raise ValueError(f"{label} must be at most {max_length} characters")
        return value

    return convert


def texts(value: Any, label: str) -> tuple[str, ...]:
    """A list of non-empty strings."""
    if isinstance(value, str) or not isinstance(value, Sequence | set | frozenset):
        raise TypeError(f"{label} must be a list of strings, not {value!r}")
    items = tuple(value)
    if not all(isinstance(item, str) and item for item in items):
        raise TypeError(f"{label} must be a list of non-empty strings, not {value!r}")
    return items


#: The shortest secret accepted, in bytes (HMAC-SHA256's output length).
MIN_SECRET_BYTES = 32


def secret(value: Any, label: str) -> bytes:
    """A secret key (a string or bytes) of at least 32 bytes, as bytes; the errors give the
    secret's type or length, never the secret itself."""
    if not isinstance(value, str | bytes):
        raise TypeError(f"{label} must be a string or bytes (a secret), not {type(value).__name__}")
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{label} must be at least {MIN_SECRET_BYTES} bytes long, not {len(raw)} "
            "(python -c 'import secrets; print(secrets.token_urlsafe(48))' makes one)"
        )
    return raw


def optional(convert: Converter[T]) -> Converter[T | None]:
    """None, or what ``convert`` accepts."""

    def convert_optional(value: Any, label: str) -> T | None:
        return None if value is None else convert(value, label)

    return convert_optional


def text_mapping(value: Any, label: str) -> dict[str, str]:
    """A dict of non-empty strings to non-empty strings."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{label} must be a dict, not {value!r}")
    for key, item in value.items():
        if not (isinstance(key, str) and key and isinstance(item, str) and item):
            raise TypeError(f"{label} must map strings to strings; {key!r}: {item!r} does not")
    return dict(value)


def dotted_path_or_object(value: Any, label: str) -> Any:
    """A dotted import path (imported where it is used) or the object itself."""
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{label} must not be an empty string")
    return value


def objects(value: Any, label: str) -> tuple[Any, ...]:
    """A list of dotted paths or objects."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{label} must be a list, not {value!r}")
    return tuple(dotted_path_or_object(item, label) for item in value)
