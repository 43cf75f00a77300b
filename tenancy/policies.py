"""Row-level security for your tenant-isolated models, written by ``makemigrations``.

A model of yours that declares ``tenant_isolated = True`` gets its table's
policy from a migration that ``makemigrations`` writes, as it writes an index
or a constraint: nobody writes RLS SQL by hand.

- :class:`TenantIsolation` is the policy as Django's migrations see it: a
  constraint (``Meta.constraints``), so ``makemigrations`` adds it with
  ``AddConstraint`` (or inside ``CreateModel``) when a model becomes
  tenant-isolated, new or not, and removes it with ``RemoveConstraint`` when
  the model stops being so; both are reversible. Creating it enables and
  forces row-level security on the table and creates the one policy of the
  design, ``tenant_id = (SELECT tenancy_current_tenant())`` in ``USING`` and
  ``WITH CHECK``, which holds in the plain and in the verified tenant context.
- :func:`declare_policies` (``TenancyConfig.ready()``) puts one in the
  constraints of every tenant-isolated model of yours (never the library's:
  their policies ship in their SQL files).
- :func:`install_autodetector` makes the migrations it writes depend on
  tenancy's migration 0002, which defines the functions their SQL calls
  (``tenancy_isolate``, ``tenancy_release``: tenancy/sql/0002_tenant_isolation.sql).

A table whose policy a hand-written migration created under the same name
(``<table>_tenant_isolation``, the name these docs always gave it) is taken
over, not duplicated: the policy is replaced by the design's, and the one it
replaced is recorded in the new policy's comment, so that reversing the
migration puts it back.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.db.models import Model
from django.db.models.constraints import BaseConstraint

#: The migration of tenancy that defines the functions the policies call
#: (tenancy_isolate, tenancy_release; tenancy_current_tenant before them).
FUNCTION_MIGRATION = ("tenancy", "0002_tenant_isolation")


def _library_apps() -> frozenset[str]:
    """Apps whose policies ship as SQL files in their own migrations (tenancy's matrix)."""
    from tenancy.privileges import governed_apps

    return governed_apps()


def policy_name(table: str) -> str:
    """``<table>_tenant_isolation``, shortened with a hash past PostgreSQL's 63 bytes."""
    name = f"{table}_tenant_isolation"
    if len(name.encode()) <= 63:
        return name
    digest = hashlib.sha256(table.encode()).hexdigest()[:8]
    return f"{table.encode()[:36].decode(errors='ignore')}_{digest}_tenant_isolation"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class TenantIsolation(BaseConstraint):
    """The tenant-isolation policy of a model's table, as a constraint migrations can carry.

    Not written by hand: :func:`declare_policies` adds it to every model of
    yours with ``tenant_isolated = True``. ``name`` is the policy's name.
    """

    def __init__(self, *, name: str) -> None:
        super().__init__(name=name)

    def create_sql(self, model: type[Model] | None, schema_editor: Any) -> str:
        assert model is not None
        return self._call("tenancy_isolate", model, schema_editor)

    def remove_sql(self, model: type[Model] | None, schema_editor: Any) -> str:
        assert model is not None
        return self._call("tenancy_release", model, schema_editor)

    def _call(self, function: str, model: type[Model], schema_editor: Any) -> str:
        """One statement: the PL/pgSQL lives in tenancy/sql/0002_tenant_isolation.sql."""
        table = _literal(schema_editor.quote_name(model._meta.db_table))
        return f"SELECT {function}({table}::regclass, {_literal(self.name)})"

    def constraint_sql(self, model: type[Model] | None, schema_editor: Any) -> str:
        """Inside ``CREATE TABLE``: nothing; the policy follows once the table exists."""
        schema_editor.deferred_sql.append(self.create_sql(model, schema_editor))
        return ""

    def validate(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to check in Python: the database refuses another tenant's row."""

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        return "tenancy.policies.TenantIsolation", (), {"name": self.name}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TenantIsolation) and other.name == self.name

    def __hash__(self) -> int:
        return hash((TenantIsolation, self.name))

    def __repr__(self) -> str:
        return f"<TenantIsolation: name={self.name!r}>"


def declares_policy(model: type[Model]) -> bool:
    """A model of yours, with a table of its own and ``tenant_isolated = True``."""
    meta = model._meta
    return bool(
        getattr(model, "tenant_isolated", False)
        and meta.app_label not in _library_apps()
        and meta.managed and not meta.proxy and not meta.abstract and not meta.swapped
        and any(f.column == "tenant_id" for f in meta.local_concrete_fields)
    )


def declare_policies() -> None:
    """Give every tenant-isolated model of yours its :class:`TenantIsolation` constraint.

    Called once by ``TenancyConfig.ready()``, when every model is loaded. The
    constraint joins ``Meta.constraints`` (a new list, so an abstract parent's
    is not shared), where ``makemigrations`` and ``migrate`` see it.
    """
    from django.apps import apps

    for model in apps.get_models():
        if not declares_policy(model):
            continue
        meta = model._meta
        if any(isinstance(c, TenantIsolation) for c in meta.constraints):
            continue
        meta.constraints = [*meta.constraints, TenantIsolation(name=policy_name(meta.db_table))]
        meta.original_attrs["constraints"] = meta.constraints


def _declares(operation: Any) -> bool:
    """Whether a migration operation creates a :class:`TenantIsolation`."""
    from django.db import migrations

    if isinstance(operation, migrations.AddConstraint):
        return isinstance(operation.constraint, TenantIsolation)
    if isinstance(operation, migrations.CreateModel):
        return any(isinstance(c, TenantIsolation) for c in operation.options.get("constraints", ()))
    return False


class TenancyAutodetectorMixin:
    """Migrations that create a policy depend on the one that defines its function."""

    def changes(self, *args: Any, **kwargs: Any) -> dict[str, list[Any]]:
        changes: dict[str, list[Any]] = super().changes(*args, **kwargs)  # type: ignore[misc]
        governed = _library_apps()
        for app_label, migrations in changes.items():
            if app_label in governed:
                continue
            for migration in migrations:
                needs = any(_declares(op) for op in migration.operations)
                if needs and tuple(FUNCTION_MIGRATION) not in map(tuple, migration.dependencies):
                    migration.dependencies.append(FUNCTION_MIGRATION)
        return changes


def install_autodetector() -> None:
    """Put :class:`TenancyAutodetectorMixin` into ``makemigrations`` and ``migrate``.

    Django 5.2's commands take their autodetector from a class attribute, and
    its check ``commands.E001`` wants both to be the same class: the mixin
    goes in front of makemigrations' (another app's autodetector too), and
    both commands get the result.
    """
    from django.core.management.commands import makemigrations, migrate

    current = makemigrations.Command.autodetector
    if not issubclass(current, TenancyAutodetectorMixin):
        current = type("MigrationAutodetector", (TenancyAutodetectorMixin, current), {})
    makemigrations.Command.autodetector = current
    migrate.Command.autodetector = current
