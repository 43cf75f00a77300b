"""The verified tenant context, on the database's side: keys and the mode switch.

Every policy of the library compares ``tenant_id`` with
``tenancy_current_tenant()`` (tenancy's migration 0001). In the plain mode
that function returns the setting ``app.tenant_id``; in the verified mode it
returns only the tenant named by a token whose MAC verifies for the current
transaction (``tenancy_verified_tenant()``). The mode is the function's
definition, so only its owner (the role that ran ``migrate``) switches it, and
the keys live in a table only the owner can read. ``manage.py
verified_context`` calls the functions below; docs/roles.md explains the
design.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections, transaction

from django_idempotency_outbox.errors import ConfigurationError
from tenancy.conf import ContextKey, tenancy_settings
from tenancy.context import TOKEN_GUC, mint_token, read_binding

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

#: The two definitions of tenancy_current_tenant(); {schema} is quoted.
_PLAIN = """
CREATE OR REPLACE FUNCTION {schema}.tenancy_current_tenant() RETURNS bigint
LANGUAGE sql STABLE
AS $function$
    SELECT nullif(current_setting('app.tenant_id', true), '')::bigint
$function$
"""
_VERIFIED = """
CREATE OR REPLACE FUNCTION {schema}.tenancy_current_tenant() RETURNS bigint
LANGUAGE sql STABLE PARALLEL RESTRICTED
AS $function$
    SELECT {schema}.tenancy_verified_tenant()
$function$
"""

#: A tenant id that the self-test mints a token for (no row is read).
_PROBE_TENANT = 1


@dataclass(frozen=True)
class InstalledKey:
    key_id: str
    installed_at: datetime


@dataclass(frozen=True)
class Status:
    """What the database says (read as the owner)."""

    migrated: bool
    verified: bool
    keys: list[InstalledKey]


def _quoted_schema(cursor: CursorWrapper) -> str:
    cursor.execute("SELECT quote_ident(current_schema())")
    return str(cursor.fetchone()[0])


def database_mode(using: str) -> str | None:
    """"plain", "verified", or None when tenancy's migration has not run.

    Any role may ask: it reads the function's definition from the catalog.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT p.prosrc FROM pg_proc AS p WHERE p.proname = 'tenancy_current_tenant'"
            " AND p.pronamespace = current_schema()::regnamespace"
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return "verified" if "tenancy_verified_tenant" in row[0] else "plain"


def readable_keys(using: str) -> int:
    """How many keys the role of ``using`` can read (0 unless something is wrong)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT has_table_privilege('tenancy_context_keys', 'SELECT')")
        if not cursor.fetchone()[0]:
            return 0
        cursor.execute("SELECT count(*) FROM tenancy_context_keys")
        return int(cursor.fetchone()[0])


def status(using: str) -> Status:
    """The mode and the installed keys (as the owner: no other role sees a key)."""
    mode = database_mode(using)
    if mode is None:
        return Status(migrated=False, verified=False, keys=[])
    _require_owner(using, "listing the keys")
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT key_id, installed_at FROM tenancy_context_keys ORDER BY installed_at, key_id"
        )
        keys = [InstalledKey(*row) for row in cursor.fetchall()]
    return Status(migrated=True, verified=mode == "verified", keys=keys)


def accepts(using: str, key: ContextKey) -> bool:
    """Does the database verify a token signed with ``key``?

    Mints a token in a transaction of its own on ``using`` and asks
    ``tenancy_verified_tenant()`` (whatever the mode): the end-to-end answer,
    from any role.
    """
    with transaction.atomic(using=using):
        connection = connections[using]
        token = mint_token(key, _PROBE_TENANT, read_binding(connection))
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config(%s, %s, true), tenancy_verified_tenant()", [TOKEN_GUC, token]
            )
            tenant: int | None = cursor.fetchone()[1]
            verified = tenant == _PROBE_TENANT
        transaction.set_rollback(True, using=using)
    return verified


def _require_owner(using: str, doing: str) -> None:
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT pg_has_role(current_user, p.proowner, 'USAGE'), current_user"
            "  FROM pg_proc AS p WHERE p.proname = 'tenancy_current_tenant'"
            "   AND p.pronamespace = current_schema()::regnamespace"
        )
        row = cursor.fetchone()
    if row is None:
        raise ConfigurationError(
            f"tenancy_current_tenant() does not exist on {using!r}: run manage.py migrate"
        )
    if not row[0]:
        raise ConfigurationError(
            f"Database alias {using!r} connects as {row[1]!r}, which does not own the "
            f"library's tables: {doing} is the owner's job (--database with the alias that "
            "runs migrate)."
        )


def signing_key() -> ContextKey:
    key = tenancy_settings.VERIFIED_CONTEXT
    if key is None:
        raise ConfigurationError(
            'TENANCY["VERIFIED_CONTEXT"] is not set: it names the key to install '
            '({"KEY_ID": ..., "KEY": ...}, docs/settings.md).'
        )
    return key


def add_key(using: str, key: ContextKey) -> bool:
    """Install ``key`` (as the owner). True if added, False if it was already there.

    Raises:
        ConfigurationError: a different key is installed under the same id.
    """
    _require_owner(using, "installing a key")
    inner, outer = key.pads()
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(
            "INSERT INTO tenancy_context_keys (key_id, inner_pad, outer_pad) VALUES (%s, %s, %s)"
            " ON CONFLICT (key_id) DO NOTHING RETURNING key_id",
            [key.key_id, inner, outer],
        )
        if cursor.fetchone() is not None:
            return True
        cursor.execute(
            "SELECT inner_pad = %s AND outer_pad = %s FROM tenancy_context_keys"
            " WHERE key_id = %s",
            [inner, outer, key.key_id],
        )
        if not cursor.fetchone()[0]:
            raise ConfigurationError(
                f"A different key is installed under the id {key.key_id!r}: give the new key "
                "an id of its own (keys are never replaced in place, docs/roles.md)."
            )
    return False


def remove_key(using: str, key_id: str) -> None:
    """Remove an installed key (as the owner).

    Raises:
        ConfigurationError: no such key, or it is the key the settings sign with
            while the verified mode is on (every request would lose its tenant).
    """
    _require_owner(using, "removing a key")
    current = tenancy_settings.VERIFIED_CONTEXT
    if current is not None and current.key_id == key_id and database_mode(using) == "verified":
        raise ConfigurationError(
            f'{key_id!r} is the key TENANCY["VERIFIED_CONTEXT"] signs with, and the verified '
            "mode is on: every request would lose its tenant. Sign with the new key first "
            "(docs/roles.md, rotating keys)."
        )
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("DELETE FROM tenancy_context_keys WHERE key_id = %s", [key_id])
        if cursor.rowcount == 0:
            raise ConfigurationError(f"No key {key_id!r} is installed.")


def enable(using: str) -> None:
    """Turn the verified mode on (as the owner).

    Refused unless the database accepts tokens signed with the settings' key:
    otherwise every request would lose its tenant at once.
    """
    _require_owner(using, "turning the verified mode on")
    key = signing_key()
    if not accepts(using, key):
        raise ConfigurationError(
            f'The database does not accept the key {key.key_id!r} of TENANCY["VERIFIED_CONTEXT"]:'
            " install it first (manage.py verified_context add-key)."
        )
    _define(using, _VERIFIED)


def disable(using: str) -> None:
    """Back to the plain mode (as the owner): the policies trust app.tenant_id again."""
    _require_owner(using, "turning the verified mode off")
    _define(using, _PLAIN)


def _define(using: str, template: str) -> None:
    try:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(template.format(schema=_quoted_schema(cursor)))
    except DatabaseError as exc:
        raise ConfigurationError(f"Could not redefine tenancy_current_tenant(): {exc}") from exc
