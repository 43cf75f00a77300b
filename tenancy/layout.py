"""The database layout of a deployment: ``DATABASES`` from one URL and the roles' names.

A deployment connects to one database as four roles (docs/roles.md), each through an alias;
:func:`databases` writes the four (docs/settings.md). Importing it reads no setting, so
``settings.py`` may import it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django_idempotency_outbox.errors import ConfigurationError

#: The kinds of role, in the order the aliases are written.
KINDS = ("app", "worker", "system", "owner")

#: The alias of each kind, unless ``aliases`` says otherwise: the names the
#: ``TENANCY`` settings expect by default (``APP_DATABASE`` is ``"default"``...).
DEFAULT_ALIASES = {"app": "default", "worker": "worker", "system": "system", "owner": "owner"}

#: The engine of the app, worker and system aliases: Django's PostgreSQL
#: backend, whose test database is created, flushed and dropped through the
#: owner's alias (tenancy/backends/postgresql).
ROLE_ENGINE = "tenancy.backends.postgresql"
OWNER_ENGINE = "django.db.backends.postgresql"

_SCHEMES = {"postgres", "postgresql", "pgsql"}

#: Query parameters a URL may not carry: libpq's and Django's ways to name a
#: user, a password (or where one is read), a role to switch to, a server or a
#: database, or settings for every session (``options=-c role=...``): each
#: would override, for every alias at once, what the address and ``roles`` say.
NOT_OPTIONS = frozenset({
    "user", "password", "passfile", "dbname", "host", "hostaddr", "port", "service",
    "servicefile", "options", "assume_role", "role", "sslpassword",
})
_NAME = re.compile(r"[^\s:/?#]+")


#: The longest name PostgreSQL keeps, in bytes (NAMEDATALEN - 1).
MAX_NAME_BYTES = 63


class DatabaseURLError(ConfigurationError):
    """The URL (or dict) given to :func:`databases` cannot name the aliases."""


def databases(
    url: str | Mapping[str, Any],
    *,
    roles: Mapping[str, str] | None = None,
    aliases: Mapping[str, str] | None = None,
    passfile: str | os.PathLike[str] | None = None,
    pooled: str | Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The ``DATABASES`` entries of the four roles, from one database URL.

    Args:
        url: ``postgres://HOST:PORT/NAME``, or django-environ's dict for it: the server and
            the database, never a user (each alias logs in as its own role).
        roles: the role of each kind; a kind left out is ``<database>_<kind>``.
        aliases: the alias of each kind (default: the names ``TENANCY`` expects).
        passfile: a libpq password file every alias reads its password from.
        pooled: the URL of a pgbouncer in transaction mode, for the app alias only.

    Returns:
        ``{alias: settings}`` for the four aliases (and an empty ``default`` when no kind
        is called so).

    Raises:
        DatabaseURLError: the URL is not a PostgreSQL URL, names a user, a password or
            one of :data:`NOT_OPTIONS`, or no database; a role or alias is unknown or
            repeated; a name is over 63 bytes (PostgreSQL would cut it).

    docs/settings.md says each argument in full.
    """
    server = _server(url)
    names = _roles(server["NAME"], roles or {})
    where = _aliases(aliases or {})
    options = dict(server["OPTIONS"])
    if passfile is not None:
        options["passfile"] = str(Path(passfile))
    result: dict[str, dict[str, Any]] = {}
    if "default" not in where.values():
        result["default"] = {}
    for kind in KINDS:
        entry: dict[str, Any] = {
            "ENGINE": OWNER_ENGINE if kind == "owner" else ROLE_ENGINE,
            "NAME": server["NAME"],
            "HOST": server["HOST"],
            "PORT": server["PORT"],
            "USER": names[kind],
        }
        if options:
            entry["OPTIONS"] = dict(options)
        # One test database for the four (Django groups them by server and name);
        # no creation order among them (without this, Django makes each alias wait
        # for 'default', which is an empty entry when the app's alias is not it).
        entry["TEST"] = {"DEPENDENCIES": []}
        if kind != "owner":
            entry["TEST"]["OWNER"] = where["owner"]
        if kind == "app" and pooled is not None:
            via = _server(pooled)
            entry.update(
                NAME=via["NAME"], HOST=via["HOST"], PORT=via["PORT"],
                OPTIONS={**options, **via["OPTIONS"], "prepare_threshold": None},
                CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True, DISABLE_SERVER_SIDE_CURSORS=True,
            )
        result[where[kind]] = entry
    return result


def _server(url: str | Mapping[str, Any]) -> dict[str, Any]:
    """HOST, PORT, NAME and OPTIONS from a URL or from django-environ's dict."""
    if isinstance(url, Mapping):
        engine = str(url.get("ENGINE") or "")
        if engine and not engine.endswith("postgresql"):
            raise DatabaseURLError(f"the database is not PostgreSQL (ENGINE {engine!r})")
        if url.get("USER") or url.get("PASSWORD"):
            raise DatabaseURLError(_NO_USER)
        name = str(url.get("NAME") or "")
        host, port = str(url.get("HOST") or ""), str(url.get("PORT") or "")
        options = {str(k): v for k, v in dict(url.get("OPTIONS") or {}).items()}
    elif isinstance(url, str):
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise DatabaseURLError(f"not a database URL: {exc}") from None
        if parts.scheme not in _SCHEMES:
            raise DatabaseURLError(
                f"expected a postgres:// URL, not {parts.scheme + '://' if parts.scheme else url!r}"
            )
        if "@" in parts.netloc:
            raise DatabaseURLError(_NO_USER)
        # host[:port]; [v6]:port; a socket directory percent-encoded (%2Fvar%2Frun%2Fpostgresql)
        address = re.fullmatch(r"(\[[^\]]*\]|[^:]*)(?::(\d*))?", parts.netloc)
        if address is None:
            raise DatabaseURLError(f"not a host and port: {parts.netloc!r}")
        host = unquote(address.group(1)).removeprefix("[").removesuffix("]")
        port = address.group(2) or ""
        name = unquote(parts.path.lstrip("/"))
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
    else:
        raise DatabaseURLError(f"expected a URL or a dict, not a {type(url).__name__}")
    named = sorted(key for key in options if key.lower() in NOT_OPTIONS)
    if named:
        raise DatabaseURLError(
            f"the URL's options name {', '.join(named)}: who logs in, with which password, "
            "and to which server and database are not options. The URL names the server and "
            "the database in its address only; each alias logs in as its own role "
            "(roles=...; passwords from passfile=... or each alias's PASSWORD)"
        )
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise DatabaseURLError(
            f"the database name {name!r} is over {MAX_NAME_BYTES} bytes: PostgreSQL would cut it"
        )
    if not _NAME.fullmatch(name):
        raise DatabaseURLError(
            "the URL names no database: postgres://HOST:PORT/NAME"
            if not name else f"{name!r} is not a database name"
        )
    return {"NAME": name, "HOST": host, "PORT": port, "OPTIONS": options}


_NO_USER = (
    "the URL names a user or a password: it names the server and the database only, each alias "
    "logs in as its own role (roles=...; passwords from passfile=... or each alias's PASSWORD)"
)


def _roles(database: str, given: Mapping[str, str]) -> dict[str, str]:
    unknown = sorted(set(given) - set(KINDS))
    if unknown:
        raise DatabaseURLError(f"unknown role kind(s) {unknown}; expected {', '.join(KINDS)}")
    names = {kind: given.get(kind) or f"{database}_{kind}" for kind in KINDS}
    for kind, name in names.items():
        if not isinstance(name, str) or not name.strip():
            raise DatabaseURLError(f"the {kind} role's name must be a non-empty string")
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise DatabaseURLError(
                f"the {kind} role's name {name!r} is over {MAX_NAME_BYTES} bytes: PostgreSQL "
                "would cut it (name it with roles=...)"
            )
    if len(set(names.values())) != len(names):
        raise DatabaseURLError(f"each kind needs a role of its own: {names}")
    return names


def _aliases(given: Mapping[str, str]) -> dict[str, str]:
    unknown = sorted(set(given) - set(KINDS))
    if unknown:
        raise DatabaseURLError(f"unknown alias kind(s) {unknown}; expected {', '.join(KINDS)}")
    where = {**DEFAULT_ALIASES, **given}
    if len(set(where.values())) != len(where):
        raise DatabaseURLError(f"each kind needs an alias of its own: {where}")
    if where["owner"] == "default":
        raise DatabaseURLError(
            "the owner's alias must not be 'default': queries that name no alias "
            "(django.db.connection, transaction.atomic()) would run as the tables' owner"
        )
    return where
