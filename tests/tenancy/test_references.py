"""References between tenant-isolated models include tenant_id (tenancy/references.py).

The test app's ``Refund`` refers to its ``Order`` with a ``TenantForeignKey``:
``makemigrations`` writes the composite foreign key ``(tenant_id, order_id)``
-> ``(tenant_id, id)`` and the key it needs; a tenant can then refer only to
its own orders, and another tenant's are refused exactly as ids that do not
exist. ``check`` warns about a plain foreign key between tenant-isolated
models (tenancy.W047).
"""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command
from django.core.management.commands import makemigrations
from django.db import IntegrityError, connections, migrations, models, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.questioner import MigrationQuestioner
from django.db.migrations.state import ModelState, ProjectState
from django.test.utils import isolate_apps

from tenancy import TenantForeignKey, tenant_context
from tenancy.references import TenantKey, TenantReference, reference_problems
from tests.helpers import observer
from tests.testapp.models import Order, Refund

KEY = TenantKey(fields=("tenant_id", "id"), name="testapp_order_id_tenant_key")
REFERENCE = TenantReference(field="order", name="testapp_refund_order_id_tenant_fk")


def _state() -> ProjectState:
    return MigrationLoader(None, ignore_no_migrations=True).project_state()


def _changes(before: ProjectState, after: ProjectState, apps: set[str]) -> dict[str, list]:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    detector = makemigrations.Command.autodetector(
        before, after, MigrationQuestioner(specified_apps=apps))  # new apps get a first one
    return detector.changes(graph=loader.graph, trim_to_apps=apps)


def _created(migration) -> list:
    """Every constraint the migration's operations create."""
    found = []
    for operation in migration.operations:
        if isinstance(operation, migrations.AddConstraint):
            found.append(operation.constraint)
        elif isinstance(operation, migrations.CreateModel):
            found += operation.options.get("constraints", [])
    return found


def _without_refund() -> ProjectState:
    state = _state()
    state.remove_model("testapp", "refund")
    order = state.models["testapp", "order"]
    order.options["constraints"] = [c for c in order.options["constraints"] if c != KEY]
    return state


def test_makemigrations_writes_the_reference_with_the_tenant_and_the_key_it_needs():
    [migration] = _changes(_without_refund(), _state(), {"testapp"})["testapp"]
    created = _created(migration)
    assert KEY in created and REFERENCE in created
    [field] = [op.field for op in migration.operations
               if isinstance(op, migrations.AddField) and op.name == "order"]
    assert isinstance(field, TenantForeignKey)
    name, path, args, kwargs = field.deconstruct()
    assert path == "tenancy.references.TenantForeignKey" and "db_constraint" not in kwargs
    assert field.db_constraint is False  # Django's own constraint, on order_id alone, is off


def test_a_reference_to_another_apps_model_waits_for_the_migration_that_adds_its_key():
    """Django makes a migration with a foreign key depend on the latest new migration of
    the app it refers to: the one that adds the key, when there is one."""
    after = _state()
    refund = after.models["testapp", "refund"]
    after.remove_model("testapp", "refund")
    after.add_model(ModelState("elsewhere", "refund", list(refund.fields.items()),
                               {**refund.options, "db_table": "elsewhere_refund"}))
    before = _without_refund()
    changes = _changes(before, after, {"testapp", "elsewhere"})
    [keyed] = changes["testapp"]
    [referring] = changes["elsewhere"]
    assert KEY in _created(keyed)
    assert any(isinstance(c, TenantReference) for c in _created(referring))
    assert ("testapp", keyed.name) in referring.dependencies


def constraints_of(table: str) -> set[tuple[str, str, str]]:
    """(kind, columns, definition) of ``table``'s unique and foreign key constraints."""
    with observer() as conn:
        return set(conn.execute(
            "SELECT contype::text, (SELECT string_agg(a.attname, ',' ORDER BY k.n)"
            "   FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)"
            "   JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum),"
            "  pg_get_constraintdef(c.oid)"
            "  FROM pg_constraint c WHERE conrelid = %s::regclass AND contype IN ('u', 'f')",
            [table]).fetchall())


def test_the_database_refers_from_tenant_and_order_to_tenant_and_id():
    assert constraints_of("testapp_refund") == {(
        "f", "tenant_id,order_id",
        "FOREIGN KEY (tenant_id, order_id) REFERENCES testapp_order(tenant_id, id)"
        " DEFERRABLE INITIALLY DEFERRED",
    )}
    assert ("u", "tenant_id,id", "UNIQUE (tenant_id, id)") in constraints_of("testapp_order")


def refund(tenant: int, order_id: int) -> str:
    """Commit a refund of ``order_id`` as ``tenant`` (the app role); the refusal, if any."""
    try:
        with tenant_context(tenant):
            Refund.objects.create(tenant_id=tenant, order_id=order_id, amount=5)
    except IntegrityError as exc:
        return str(exc)
    return ""


def test_a_tenant_refers_to_its_own_orders_only_and_learns_nothing_of_anothers():
    with tenant_context(1):
        first = Order.objects.create(tenant_id=1, sku="tea")
    with tenant_context(2):
        own = Order.objects.create(tenant_id=2, sku="rice")
    assert refund(2, own.pk) == ""
    assert refund(1, first.pk) == ""
    foreign = refund(2, first.pk)  # tenant 1's order, which exists
    missing = refund(2, own.pk + 1000)  # no order at all
    assert "violates foreign key constraint" in foreign
    # The same refusal, but for the id: nothing tells tenant 2 that tenant 1's order exists.
    assert re.sub(r"\b\d+\b", "#", foreign) == re.sub(r"\b\d+\b", "#", missing), (foreign, missing)
    with observer() as conn:
        assert conn.execute("SELECT tenant_id, order_id FROM testapp_refund ORDER BY 1").fetchall(
        ) == [(1, first.pk), (2, own.pk)]


def test_the_migration_reverses_and_applies_again():
    try:
        call_command("migrate", "testapp", "0007", database="owner", verbosity=0)
        assert ("u", "tenant_id,id", "UNIQUE (tenant_id, id)") not in constraints_of(
            "testapp_order")
    finally:
        call_command("migrate", "testapp", database="owner", verbosity=0)
    assert len(constraints_of("testapp_refund")) == 1


def test_dropping_the_last_reference_drops_the_key_after_it():
    """The key's removal comes first in the migration (models in name order): it waits."""
    before = _state()
    after = _state()
    fields = after.models["testapp", "refund"].fields
    fields["order"] = models.BigIntegerField()  # no longer a reference
    after.models["testapp", "refund"].options["constraints"] = [
        c for c in after.models["testapp", "refund"].options["constraints"] if c != REFERENCE]
    order = after.models["testapp", "order"]
    order.options["constraints"] = [c for c in order.options["constraints"] if c != KEY]
    [migration] = _changes(before, after, {"testapp"})["testapp"]
    removed = [op.name for op in migration.operations
               if isinstance(op, migrations.RemoveConstraint)]
    assert removed.index(KEY.name) < removed.index(REFERENCE.name)
    owner = connections["owner"]
    try:
        with transaction.atomic(using="owner"):
            with owner.schema_editor() as editor:
                migration.apply(before, editor)
            assert constraints_of_as(owner, "testapp_refund") == set()
            keys = {columns for _, columns, _ in constraints_of_as(owner, "testapp_order")}
            assert "tenant_id,id" not in keys
            transaction.set_rollback(True, using="owner")
    finally:
        owner.close()
    assert len(constraints_of("testapp_refund")) == 1  # rolled back


def constraints_of_as(connection, table: str) -> set[tuple[str, str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT contype::text, (SELECT string_agg(a.attname, ',' ORDER BY k.n)"
            "   FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)"
            "   JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum),"
            "  pg_get_constraintdef(c.oid)"
            "  FROM pg_constraint c WHERE conrelid = %s::regclass AND contype IN ('u', 'f')",
            [table])
        return set(cursor.fetchall())


# --- manage.py check ------------------------------------------------------------------------

def test_the_test_apps_references_pass_the_check():
    call_command("check", "--fail-level", "WARNING", verbosity=0)


@pytest.mark.parametrize(("kind", "expected"), [
    ("plain", ["tenancy.W047"]),
    ("one-to-one", ["tenancy.W047"]),
    ("tenant", []),
    ("no constraint", []),  # db_constraint=False: made by hand (docs/roles.md), or none
    ("to a shared model", []),
    ("tenant to a shared model", ["tenancy.E048"]),
])
def test_the_check_warns_about_a_plain_foreign_key_between_tenant_isolated_models(kind, expected):
    with isolate_apps("tests.testapp"):
        class Parent(models.Model):
            tenant_isolated = True
            tenant_id = models.BigIntegerField()

            class Meta:
                app_label = "testapp"

        class Shared(models.Model):
            class Meta:
                app_label = "testapp"

        field = {
            "plain": lambda: models.ForeignKey(Parent, on_delete=models.CASCADE),
            "one-to-one": lambda: models.OneToOneField(Parent, on_delete=models.CASCADE),
            "tenant": lambda: TenantForeignKey(Parent, on_delete=models.CASCADE),
            "no constraint": lambda: models.ForeignKey(Parent, on_delete=models.CASCADE,
                                                       db_constraint=False),
            "to a shared model": lambda: models.ForeignKey(Shared, on_delete=models.CASCADE),
            "tenant to a shared model": lambda: TenantForeignKey(Shared,
                                                                 on_delete=models.CASCADE),
        }[kind]()

        class Child(models.Model):
            tenant_isolated = True
            tenant_id = models.BigIntegerField()
            parent = field

            class Meta:
                app_label = "testapp"

        found = reference_problems([Parent, Shared, Child])
    assert [m.id for m in found] == expected
    if expected == ["tenancy.W047"]:
        assert found[0].obj is Child._meta.get_field("parent")
        assert "TenantForeignKey" in found[0].hint
