"""The verified tenant context: SQL injected on the app role cannot pick another tenant.

Every test here runs as the app role, with the database in the verified mode
(the module turns it on as the owner if the run is in the plain mode, and
back off afterwards). The attack tests are marked ``attack``: the sensitivity
tests at the end run them again in a subprocess with the protection removed
(the policies back on the plain setting; the verifier ignoring the
transaction) and require them to fail.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import psycopg
import pytest
from django.conf import settings as django_settings
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.test import override_settings

from tenancy import context, tenant_context
from tenancy.conf import ContextKey, tenancy_settings
from tenancy.context import mint_token
from tenancy.verified import database_mode
from tests.helpers import app_connection, connect, observer, raises_rls_violation, server_pid
from tests.testapp.factories import OrderFactory
from tests.testapp.models import Order

ROOT = Path(__file__).resolve().parents[2]
A, B = 1, 2

#: DIO_TEST_WEAKEN=plain leaves the database in the plain mode (the policies
#: trust app.tenant_id) while the web side still mints tokens; =binding makes
#: the verifier ignore the transaction (a constant binding). Only the
#: sensitivity tests below set it.
WEAKEN = os.environ.get("DIO_TEST_WEAKEN", "")

attack = pytest.mark.attack


def verified_with(key: dict[str, str] | None) -> override_settings:
    """``TENANCY["VERIFIED_CONTEXT"]`` set to ``key`` (None: absent) while the block runs."""
    tenancy = {k: v for k, v in django_settings.TENANCY.items() if k != "VERIFIED_CONTEXT"}
    return override_settings(TENANCY=tenancy if key is None else {**tenancy,
                                                                   "VERIFIED_CONTEXT": key})


def owner_command(*args: str) -> str:
    out = io.StringIO()
    call_command("verified_context", *args, database="owner", stdout=out)
    return out.getvalue()


@pytest.fixture(scope="module", autouse=True)
def _verified_mode(django_db_setup, django_db_blocker):
    """The verified mode, in the database and in the settings, for this module."""
    key = django_settings.VERIFIED_CONTEXT_KEY
    already = bool(django_settings.TENANCY.get("VERIFIED_CONTEXT"))
    verified = override_settings(TENANCY={**django_settings.TENANCY, "VERIFIED_CONTEXT": key})
    verified.enable()
    with django_db_blocker.unblock():
        owner_command("add-key")
        if WEAKEN != "plain":
            owner_command("enable")
        if WEAKEN == "binding":  # the same constant on both sides
            with connections["owner"].cursor() as cursor:
                cursor.execute(
                    "CREATE OR REPLACE FUNCTION tenancy_context_binding() RETURNS text"
                    " LANGUAGE sql STABLE AS $$ SELECT 'any transaction' $$"
                )
            context.read_binding = lambda connection: "any transaction"
        try:
            yield
        finally:
            verified.disable()
            if not already:
                owner_command("disable")
            connections["owner"].close()


@pytest.fixture
def orders():
    with tenant_context(A):
        a = OrderFactory(sku="a-1")
    with tenant_context(B):
        b = OrderFactory(sku="b-1")
    return a, b


def skus(cursor) -> set[str]:
    cursor.execute("SELECT sku FROM testapp_order")
    return {sku for (sku,) in cursor.fetchall()}


def valid_token_for(conn: psycopg.Connection, tenant_id: int) -> str:
    """What tenant_context sets for ``tenant_id`` in ``conn``'s open transaction."""
    binding = conn.execute("SELECT tenancy_context_binding()").fetchone()[0]
    return mint_token(tenancy_settings.VERIFIED_CONTEXT, tenant_id, binding)


def set_token(conn: psycopg.Connection, token: str) -> None:
    """What tenant_context sets: the token, and app.tenant_id for code that reads it."""
    conn.execute("SELECT set_config('app.tenant_token', %s, true),"
                 " set_config('app.tenant_id', split_part(%s, '.', 1), true)", [token, token])


#: The injected SQL sets both too: whatever the policies trust, it tries.
inject = set_token


# --- it works -----------------------------------------------------------------------


def test_the_database_is_in_the_verified_mode():
    if WEAKEN == "plain":
        pytest.skip("the plain-policy sensitivity run")
    assert database_mode("owner") == "verified"


def test_tenant_context_sees_and_writes_its_own_rows(orders):
    with tenant_context(A):
        assert set(Order.objects.values_list("sku", flat=True)) == {"a-1"}
        Order.objects.create(tenant_id=A, sku="a-2")
    with tenant_context(B):
        assert set(Order.objects.values_list("sku", flat=True)) == {"b-1"}


def test_nested_contexts_switch_and_restore_the_verified_tenant(orders):
    with tenant_context(A):
        with tenant_context(B):
            assert set(Order.objects.values_list("sku", flat=True)) == {"b-1"}
        assert set(Order.objects.values_list("sku", flat=True)) == {"a-1"}


def test_the_web_process_reads_the_binding_the_verifier_computes():
    from django.db import transaction

    from tenancy.context import read_binding

    for use_cursor in (False, True):  # with BEGIN in one message, and inside a transaction
        with transaction.atomic(using=tenancy_settings.APP_DATABASE):
            if use_cursor:
                with app_connection().cursor() as cursor:
                    cursor.execute("SELECT 1")
            client = read_binding(app_connection())
            with app_connection().cursor() as cursor:
                cursor.execute("SELECT tenancy_context_binding()")
                assert client == cursor.fetchone()[0]


def test_a_token_minted_for_this_transaction_is_accepted(orders):
    with connect(autocommit=True) as conn, conn.transaction():
        set_token(conn, valid_token_for(conn, B))
        assert skus(conn.cursor()) == {"b-1"}


def test_a_key_longer_than_the_hash_block_verifies_like_pythons_hmac(orders):
    long_key = ContextKey("tests-long", b"k" * 100)  # hashed first, as HMAC says
    owner_key = {"KEY_ID": "tests-long", "KEY": "k" * 100}
    try:
        with verified_with(owner_key):
            owner_command("add-key")
        with connect(autocommit=True) as conn, conn.transaction():
            binding = conn.execute("SELECT tenancy_context_binding()").fetchone()[0]
            set_token(conn, mint_token(long_key, B, binding))
            assert skus(conn.cursor()) == {"b-1"}
    finally:
        owner_command("remove-key", "tests-long")


# --- the attacks: SQL injected on the app role inside tenant A's transaction ------


@attack
def test_an_injected_tenant_id_setting_is_ignored(orders):
    with tenant_context(A), app_connection().cursor() as cursor:
        cursor.execute(f"SELECT set_config('app.tenant_id', '{B}', true)")
        assert skus(cursor) == {"a-1"}  # still its own tenant's rows, not B's
        with pytest.raises(Exception, match="row-level security"):
            cursor.execute("SAVEPOINT s")
            try:
                cursor.execute("INSERT INTO testapp_order (tenant_id, sku, quantity, note)"
                               f" VALUES ({B}, 'forged', 1, '')")
            finally:
                cursor.execute("ROLLBACK TO SAVEPOINT s")


@attack
def test_a_forged_token_is_refused(orders):
    wrong_key = ContextKey("tests-1", b"not-the-key-but-as-long-as-one-0123456789")
    with connect(autocommit=True) as conn, conn.transaction():
        set_token(conn, valid_token_for(conn, A))
        binding = conn.execute("SELECT tenancy_context_binding()").fetchone()[0]
        for forged in (
            f"{B}.tests-1.{'0' * 64}",  # a made-up MAC
            mint_token(wrong_key, B, binding),  # right binding, wrong key
            valid_token_for(conn, A).replace(f"{A}.", f"{B}.", 1),  # A's MAC, B's id
        ):
            inject(conn, forged)
            assert skus(conn.cursor()) == set(), forged
            with raises_rls_violation(), conn.transaction():
                conn.execute("INSERT INTO testapp_order (tenant_id, sku, quantity, note)"
                             f" VALUES ({B}, 'forged', 1, '')")


@attack
def test_a_token_replayed_in_a_later_transaction_of_the_same_backend_is_refused(orders):
    with connect(autocommit=True) as conn:
        pid = server_pid(conn)
        with conn.transaction():  # tenant B's request, whose token injected SQL saved
            seen = valid_token_for(conn, B)
            set_token(conn, seen)
            assert skus(conn.cursor()) == {"b-1"}
        with conn.transaction():  # a later request of tenant A's, on the same backend
            set_token(conn, valid_token_for(conn, A))
            assert server_pid(conn) == pid
            inject(conn, seen)
            assert skus(conn.cursor()) == set()
            with raises_rls_violation(), conn.transaction():
                conn.execute("INSERT INTO testapp_order (tenant_id, sku, quantity, note)"
                             f" VALUES ({B}, 'replayed', 1, '')")


@attack
def test_a_token_read_from_another_sessions_pg_stat_activity_is_refused(orders):
    with connect(autocommit=True) as victim, connect(autocommit=True) as attacker:
        victim_pid = server_pid(victim)
        with victim.transaction():
            # tenant_context's statement, sent as text: visible to every
            # session of the same role while it is the session's last query
            token = valid_token_for(victim, B)
            set_token(victim, token)
            assert skus(victim.cursor()) == {"b-1"}
            victim.execute(f"SET LOCAL app.tenant_token = '{token}'")
            with attacker.transaction():
                set_token(attacker, valid_token_for(attacker, A))
                query = attacker.execute(
                    "SELECT query FROM pg_stat_activity WHERE pid = %s", [victim_pid]
                ).fetchone()[0]
                captured = query.split("'")[1]
                assert captured == token  # the attacker has the live value...
                inject(attacker, captured)
                assert skus(attacker.cursor()) == set()  # ...and it is worthless here


@attack
def test_a_token_of_another_session_is_refused_even_in_the_same_instant(orders):
    with connect(autocommit=True) as victim, connect(autocommit=True) as attacker:
        with victim.transaction(), attacker.transaction():
            token = valid_token_for(victim, B)
            set_token(victim, token)
            assert skus(victim.cursor()) == {"b-1"}
            inject(attacker, token)
            assert skus(attacker.cursor()) == set()


@attack
def test_a_function_injected_to_shadow_the_binding_cannot_aim_a_token_at_another_session(
    orders,
):
    """The web process reads the binding with names no session setting can redirect.

    Where the app role may create functions in some schema (PostgreSQL 14 and
    older let every role create in ``public``), injected SQL could shadow
    ``tenancy_context_binding()`` on its connection with one returning the
    binding of a transaction it keeps open elsewhere, and wait for another
    tenant's request on that connection to mint a token for it.
    """
    app_role = django_settings.DATABASES[tenancy_settings.APP_DATABASE]["USER"]
    with connections["owner"].cursor() as cursor:
        cursor.execute("DROP SCHEMA IF EXISTS app_writable CASCADE; CREATE SCHEMA app_writable")
        cursor.execute(f"GRANT USAGE, CREATE ON SCHEMA app_writable TO {app_role}")
    connections["owner"].close()
    web = app_connection()
    try:
        with connect(autocommit=True) as attacker, attacker.transaction():
            set_token(attacker, valid_token_for(attacker, A))  # its own request, tenant A
            aim = attacker.execute("SELECT tenancy_context_binding()").fetchone()[0]
            with web.cursor() as cursor:  # injected earlier on the web connection
                cursor.execute(
                    "CREATE FUNCTION app_writable.tenancy_context_binding() RETURNS text"
                    f" LANGUAGE sql STABLE AS $$ SELECT '{aim}' $$"
                )
                cursor.execute("SET search_path = app_writable, public")
                cursor.execute("SELECT pg_backend_pid()")
                web_pid = cursor.fetchone()[0]
            with tenant_context(B):  # tenant B's request lands on that connection
                assert set(Order.objects.values_list("sku", flat=True)) == {"b-1"}
                query = attacker.execute(
                    "SELECT query FROM pg_stat_activity WHERE pid = %s", [web_pid]
                ).fetchone()[0]
                captured = query.split("app.tenant_token = '")[1].split("'")[0]
                assert captured.startswith(f"{B}.")
                inject(attacker, captured)
                assert skus(attacker.cursor()) == set()
    finally:
        web.close()
        with connections["owner"].cursor() as cursor:
            cursor.execute("DROP SCHEMA app_writable CASCADE")
        connections["owner"].close()


# --- what the app role cannot do to the mode or the keys ---------------------------


def test_the_app_role_sees_no_key_even_with_a_blanket_grant():
    # The privilege matrix gives the app role nothing on the keys; a blanket
    # grant (GRANT ... ON ALL TABLES, as some projects do) still reads none:
    # row-level security with no policy.
    app = tenancy_settings.APP_DATABASE
    role = django_settings.DATABASES[app]["USER"]
    with observer() as conn:
        conn.execute(f'GRANT SELECT, INSERT ON tenancy_context_keys TO "{role}"')
    try:
        with connect(app, autocommit=True) as conn:
            assert conn.execute(
                "SELECT has_table_privilege('tenancy_context_keys', 'SELECT')").fetchone()[0]
            assert conn.execute("SELECT count(*) FROM tenancy_context_keys").fetchone()[0] == 0
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("INSERT INTO tenancy_context_keys (key_id, inner_pad, outer_pad)"
                             " VALUES ('mine', %s, %s)", [b"\0" * 64, b"\0" * 64])
    finally:
        with observer() as conn:
            conn.execute(f'REVOKE ALL ON tenancy_context_keys FROM "{role}"')
    with observer() as conn:
        assert conn.execute("SELECT count(*) FROM tenancy_context_keys").fetchone()[0] >= 1


def test_an_app_alias_that_can_read_a_key_is_refused_with_e026():
    app = tenancy_settings.APP_DATABASE
    role = django_settings.DATABASES[app]["USER"]
    errors = lambda: {m.id for m in checks.run_checks(databases=[app])  # noqa: E731
                      if m.level >= checks.ERROR}
    assert "tenancy.E026" not in errors()
    with observer() as conn:  # a blanket grant, and the keys' row-level security switched off
        conn.execute(f'GRANT SELECT ON tenancy_context_keys TO "{role}"')
        conn.execute("ALTER TABLE tenancy_context_keys DISABLE ROW LEVEL SECURITY")
    try:
        assert "tenancy.E026" in errors()
    finally:
        with observer() as conn:
            conn.execute("ALTER TABLE tenancy_context_keys ENABLE ROW LEVEL SECURITY")
            conn.execute(f'REVOKE ALL ON tenancy_context_keys FROM "{role}"')
        connections[app].close()
    assert "tenancy.E026" not in errors()


def test_the_app_role_cannot_switch_the_mode_back():
    with connect(autocommit=True) as conn:
        for statement in (
            "CREATE OR REPLACE FUNCTION tenancy_current_tenant() RETURNS bigint LANGUAGE sql"
            " STABLE AS $$ SELECT current_setting('app.tenant_id')::bigint $$",
            "CREATE OR REPLACE FUNCTION tenancy_context_binding() RETURNS text LANGUAGE sql"
            " STABLE AS $$ SELECT 'x' $$",
            "ALTER FUNCTION tenancy_verified_tenant() SECURITY INVOKER",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match="must be owner|permission denied"):
                conn.execute(statement)
            conn.rollback()
    with pytest.raises(CommandError, match="does not own"):
        call_command("verified_context", "disable", database=tenancy_settings.APP_DATABASE,
                     stdout=io.StringIO())


# --- the command and the checks ------------------------------------------------------


def test_status_names_the_mode_and_the_keys_never_a_secret():
    if WEAKEN:
        pytest.skip("a sensitivity run")
    out = owner_command()
    assert "mode: verified" in out
    assert "key tests-1: installed" in out
    assert "signing with 'tests-1', accepted by the database" in out
    assert django_settings.VERIFIED_CONTEXT_KEY["KEY"] not in out


def test_add_key_is_idempotent_and_refuses_another_secret_under_the_same_id():
    assert "already installed" in owner_command("add-key")
    with verified_with({"KEY_ID": "tests-1", "KEY": "x" * 40}), pytest.raises(
        CommandError, match="A different key is installed under the id"
    ):
        owner_command("add-key")


def test_the_signing_key_cannot_be_removed_while_the_mode_is_on():
    if WEAKEN:
        pytest.skip("a sensitivity run")
    with pytest.raises(CommandError, match="signs with"):
        owner_command("remove-key", "tests-1")
    with pytest.raises(CommandError, match="No key 'nope' is installed"):
        owner_command("remove-key", "nope")


def test_enable_refuses_a_key_the_database_does_not_have():
    with verified_with({"KEY_ID": "tests-absent", "KEY": "y" * 40}), pytest.raises(
        CommandError, match="does not accept the key 'tests-absent'"
    ):
        owner_command("enable")


def check_ids() -> set[str]:
    # tenancy's checks only: the outbox's import the Celery tasks, which its own tests count
    from tenancy.checks import check_database_roles

    return {m.id for m in check_database_roles(
        databases=[tenancy_settings.APP_DATABASE, tenancy_settings.SYSTEM_DATABASE])
            if m.level >= checks.ERROR}


def test_the_checks_pass_in_the_verified_mode():
    if WEAKEN:
        pytest.skip("a sensitivity run")
    assert check_ids() == set()


def test_the_checks_refuse_settings_and_database_that_disagree():
    if WEAKEN:
        pytest.skip("a sensitivity run")
    try:
        with verified_with(None):
            assert "tenancy.E023" in check_ids()  # database verified, settings plain
        with verified_with({"KEY_ID": "tests-1", "KEY": "z" * 40}):
            assert "tenancy.E024" in check_ids()  # a key the database does not accept
        owner_command("disable")
        assert "tenancy.E022" in check_ids()  # settings verified, database plain
    finally:
        owner_command("enable")


def test_the_checks_refuse_a_table_whose_policy_still_trusts_the_setting():
    if WEAKEN:
        pytest.skip("a sensitivity run")
    plain = "(SELECT nullif(current_setting('app.tenant_id', true), '')::bigint)"
    verified = "(SELECT tenancy_current_tenant())"
    policy = "ALTER POLICY testapp_payment_tenant_isolation ON testapp_payment"
    with connections["owner"].cursor() as cursor:
        cursor.execute(f"{policy} USING (tenant_id = {plain}) WITH CHECK (tenant_id = {plain})")
    try:
        assert "tenancy.E025" in check_ids()
    finally:
        with connections["owner"].cursor() as cursor:
            cursor.execute(
                f"{policy} USING (tenant_id = {verified}) WITH CHECK (tenant_id = {verified})"
            )
        connections["owner"].close()
    assert "tenancy.E025" not in check_ids()


def test_a_malformed_setting_is_a_check_error_naming_the_key(settings):
    from tenancy.checks import check_settings

    for bad in ({"KEY_ID": "ok"}, {"KEY_ID": "no spaces", "KEY": "k" * 40},
                {"KEY_ID": "ok", "KEY": "short"}, "a string", {"KEY_ID": "ok", "KEY": "k" * 40,
                                                                "EXTRA": 1}):
        settings.TENANCY = {**settings.TENANCY, "VERIFIED_CONTEXT": bad}
        messages = [m for m in check_settings() if m.id == "tenancy.E007"]
        assert messages and 'TENANCY["VERIFIED_CONTEXT"]' in messages[0].msg, bad


# --- the attack tests fail when the protection is removed --------------------------


def run_attacks_weakened(tmp_path: Path, weaken: str) -> dict[str, bool]:
    report = tmp_path / "report.xml"
    env = {
        **{k: v for k, v in os.environ.items() if k != "DIO_VERIFIED_CONTEXT"},
        "DIO_TEST_DB": os.environ.get("DIO_TEST_DB", "dio_test") + "_weak_" + weaken,
        "DIO_TEST_WEAKEN": weaken,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "attack",
         f"--junitxml={report}", "tests/tenancy/test_verified.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        case.get("name"): case.find("failure") is not None or case.find("error") is not None
        for case in ET.parse(report).getroot().iter("testcase")
    }


def test_every_attack_succeeds_when_the_policies_trust_the_plain_setting(tmp_path):
    if WEAKEN:
        pytest.skip("already a sensitivity run")
    outcomes = run_attacks_weakened(tmp_path, "plain")
    assert len(outcomes) == 6
    assert sorted(name for name, failed in outcomes.items() if not failed) == []


def test_replay_and_capture_succeed_when_the_verifier_ignores_the_transaction(tmp_path):
    if WEAKEN:
        pytest.skip("already a sensitivity run")
    outcomes = run_attacks_weakened(tmp_path, "binding")
    assert outcomes["test_a_forged_token_is_refused"] is False  # the MAC still holds
    assert outcomes["test_an_injected_tenant_id_setting_is_ignored"] is False
    assert outcomes["test_a_token_replayed_in_a_later_transaction_of_the_same_backend_is_refused"]
    assert outcomes["test_a_token_read_from_another_sessions_pg_stat_activity_is_refused"]
    assert outcomes["test_a_token_of_another_session_is_refused_even_in_the_same_instant"]
    assert outcomes[
        "test_a_function_injected_to_shadow_the_binding_cannot_aim_a_token_at_another_session"
    ]


# --- round trips ---------------------------------------------------------------------


def test_begin_and_the_binding_travel_in_one_round_trip():
    """The verified mode's new key costs the plain mode's four round trips."""
    if WEAKEN:
        pytest.skip("a sensitivity run")
    from idempotency import core
    from tests.idempotency.test_upstream import request, stored
    from tests.wire import wire

    def handler() -> core.StoredResponse:
        Order.objects.create(tenant_id=A, sku="tea")
        return stored()

    app_connection().ensure_connection()
    with wire() as traced:
        assert core.execute(request(), handler, lambda r: r).outcome is core.Outcome.EXECUTED
    sent = traced.round_trips()  # one simple-protocol Query message per round trip
    begin, lookup, order, store = sent
    assert begin.startswith("BEGIN; SELECT pg_catalog.pg_backend_pid(), EXTRACT(epoch"), sent
    assert lookup.startswith(
        "SET LOCAL app.tenant_id = '1'; SET LOCAL app.tenant_token = '1."
    ), sent
    assert order.startswith('SAVEPOINT "') and 'INSERT INTO "testapp_order"' in order, sent
    assert store.endswith("; COMMIT"), sent
