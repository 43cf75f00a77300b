"""The verified tenant context, on the database's side: keys and the mode switch.

The mode is the definition of ``tenancy_current_tenant()``, which every policy calls, so only
its owner switches it; the keys live in a table only the owner reads. ``manage.py
verified_context`` calls the functions below; docs/roles.md explains the design.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connections, transaction

from django_idempotency_outbox.errors import ConfigurationError
from tenancy.conf import ContextKey, tenancy_settings
from tenancy.context import SQL, TOKEN_GUC, mint_token, read_binding
from tenancy.statements import affected, fetch_all, fetch_one

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


def database_mode(using: str) -> str | None:
    """"plain", "verified", or None when tenancy's migration has not run.

    Any role may ask: it reads the function's definition from the catalog.
    """
    row = fetch_one(using, SQL["database_mode"])
    if row is None:
        return None
    return "verified" if "tenancy_verified_tenant" in row[0] else "plain"


def readable_keys(using: str) -> int:
    """How many keys the role of ``using`` can read (0 unless something is wrong)."""
    if not fetch_one(using, SQL["keys_readable"])[0]:
        return 0
    return int(fetch_one(using, SQL["count_keys"])[0])


def status(using: str) -> Status:
    """The mode and the installed keys (as the owner: no other role sees a key)."""
    mode = database_mode(using)
    if mode is None:
        return Status(migrated=False, verified=False, keys=[])
    _require_owner(using, "listing the keys")
    keys = [InstalledKey(*row) for row in fetch_all(using, SQL["installed_keys"])]
    return Status(migrated=True, verified=mode == "verified", keys=keys)


def accepts(using: str, key: ContextKey) -> bool:
    """Does the database verify a token signed with ``key``? The end-to-end answer, from any
    role and in either mode: a token minted and verified in a transaction rolled back."""
    with transaction.atomic(using=using):
        token = mint_token(key, _PROBE_TENANT, read_binding(connections[using]))
        tenant: int | None = fetch_one(using, SQL["verify_token"],
                                       {"guc": TOKEN_GUC, "token": token})[1]
        verified = tenant == _PROBE_TENANT
        transaction.set_rollback(True, using=using)
    return verified


def _require_owner(using: str, doing: str) -> None:
    row = fetch_one(using, SQL["owner_of_functions"])
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
    params = {"key_id": key.key_id, "inner": inner, "outer": outer}
    with transaction.atomic(using=using):
        if fetch_one(using, SQL["add_key"], params) is not None:
            return True
        if not fetch_one(using, SQL["same_key"], params)[0]:
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
    with transaction.atomic(using=using):
        if not affected(using, SQL["remove_key"], {"key_id": key_id}):
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
        with transaction.atomic(using=using):
            schema = fetch_one(using, SQL["quoted_schema"])[0]
            affected(using, template.format(schema=schema))
    except DatabaseError as exc:
        raise ConfigurationError(f"Could not redefine tenancy_current_tenant(): {exc}") from exc
