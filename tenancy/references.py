"""References between tenant-isolated models that stay within one tenant (docs/roles.md).

PostgreSQL checks a foreign key without row-level security, so a plain one lets a row name
another tenant's, and a refused write tells which ids exist. Django cannot declare a composite
foreign key: :class:`TenantForeignKey` turns its own constraint off, and
:func:`declare_references` adds :class:`TenantReference` (``(tenant_id, <column>)``) and its
target's :class:`TenantKey` (``UNIQUE (tenant_id, id)``) where ``makemigrations`` sees them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from django.core import checks
from django.db import models
from django.db.models import Model
from django.db.models.constraints import BaseConstraint

TENANT_COLUMN = "tenant_id"


def bounded(name: str) -> str:
    """``name``, shortened with a hash of it past PostgreSQL's 63 bytes."""
    if len(name.encode()) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name.encode()[:54].decode(errors='ignore')}_{digest}"


def _has_tenant(model: type[Model]) -> bool:
    return any(f.column == TENANT_COLUMN for f in model._meta.local_concrete_fields)


def _tenant_isolated(model: Any) -> bool:
    return isinstance(model, type) and bool(getattr(model, "tenant_isolated", False))


class TenantForeignKey(models.ForeignKey):  # type: ignore[type-arg]
    """A ``ForeignKey`` between tenant-isolated models whose constraint includes ``tenant_id``.

    Used as a ``ForeignKey`` (``TenantForeignKey(Order, on_delete=models.CASCADE)``);
    both models need a ``tenant_id`` column of their own. Django's query API is
    unchanged: the database's constraint is :class:`TenantReference`'s.
    """

    def __init__(self, to: Any, on_delete: Any, **kwargs: Any) -> None:
        kwargs["db_constraint"] = False  # the composite TenantReference takes its place
        super().__init__(to, on_delete, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("db_constraint", None)
        return name, path, args, kwargs


class TenantReference(BaseConstraint):
    """``FOREIGN KEY (tenant_id, <column>) REFERENCES <table> (tenant_id, <id>)``.

    Not written by hand: :func:`declare_references` adds it for each
    :class:`TenantForeignKey`. ``field`` is the field's name.
    """

    def __init__(self, *, field: str, name: str) -> None:
        super().__init__(name=name)
        self.field = field

    def _add_sql(self, model: type[Model], schema_editor: Any) -> str:
        field = model._meta.get_field(self.field)
        target = field.related_model._meta  # type: ignore[union-attr]
        q = schema_editor.quote_name
        return (
            f"ALTER TABLE {q(model._meta.db_table)} ADD CONSTRAINT {q(self.name)}"
            f" FOREIGN KEY ({q(TENANT_COLUMN)}, {q(field.column)})"  # type: ignore[union-attr]
            f" REFERENCES {q(target.db_table)}"
            f" ({q(TENANT_COLUMN)}, {q(field.target_field.column)})"  # type: ignore[union-attr]
            " DEFERRABLE INITIALLY DEFERRED"
        )

    def create_sql(self, model: type[Model] | None, schema_editor: Any) -> str:
        """At the end of the migration, once the key it refers to exists."""
        assert model is not None
        schema_editor.deferred_sql.append(self._add_sql(model, schema_editor))
        return ""

    def constraint_sql(self, model: type[Model] | None, schema_editor: Any) -> str:
        return self.create_sql(model, schema_editor)

    def remove_sql(self, model: type[Model] | None, schema_editor: Any) -> str:
        assert model is not None
        q = schema_editor.quote_name
        return f"ALTER TABLE {q(model._meta.db_table)} DROP CONSTRAINT IF EXISTS {q(self.name)}"

    def validate(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to check in Python: the database refuses another tenant's row."""

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        return ("tenancy.references.TenantReference", (),
                {"field": self.field, "name": self.name})

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TenantReference) and other.name == self.name
                and other.field == self.field)

    def __hash__(self) -> int:
        return hash((TenantReference, self.name, self.field))

    def __repr__(self) -> str:
        return f"<TenantReference: field={self.field!r} name={self.name!r}>"


class TenantKey(models.UniqueConstraint):
    """``UNIQUE (tenant_id, id)`` of a model that :class:`TenantForeignKey` fields refer to.

    Dropped at the end of its migration, after the references that need it.
    """

    def __init__(self, *, fields: Any, name: str) -> None:
        super().__init__(fields=fields, name=name)

    def remove_sql(self, model: type[Model] | None, schema_editor: Any) -> Any:
        schema_editor.deferred_sql.append(super().remove_sql(model, schema_editor))
        return ""

    def validate(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to check: the id is unique already."""


def _declare(model: type[Model], constraint: BaseConstraint) -> None:
    meta = model._meta
    if any(c.name == constraint.name for c in meta.constraints):
        return
    meta.constraints = [*meta.constraints, constraint]
    meta.original_attrs["constraints"] = meta.constraints


def _declarable(field: TenantForeignKey) -> bool:
    """Both ends are tables of yours with a ``tenant_id`` column of their own."""
    from tenancy.policies import declares_policy

    target = field.related_model
    return (isinstance(target, type) and declares_policy(field.model)
            and declares_policy(target))


def declare_references() -> None:
    """Give each :class:`TenantForeignKey` its reference (in ``Meta.constraints``), and its
    target its key; called by ``TenancyConfig.ready()``, once every model is loaded."""
    from django.apps import apps

    for model in apps.get_models():
        for field in model._meta.local_fields:
            if not isinstance(field, TenantForeignKey) or not _declarable(field):
                continue
            table, column = model._meta.db_table, field.column
            _declare(model, TenantReference(
                field=field.name, name=bounded(f"{table}_{column}_tenant_fk")))
            target, key = field.related_model, field.target_field
            _declare(target, TenantKey(
                fields=(TENANT_COLUMN, key.name),
                name=bounded(f"{target._meta.db_table}_{key.column}_tenant_key"),
            ))


def check_references(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Foreign keys between tenant-isolated models of yours include ``tenant_id``."""
    from django.apps import apps

    return reference_problems(apps.get_models())


def reference_problems(models_: Iterable[type[Model]]) -> list[checks.CheckMessage]:
    """``tenancy.W047`` and ``tenancy.E048`` for the foreign keys of ``models_``."""
    from tenancy.policies import declares_policy

    found: list[checks.CheckMessage] = []
    for model in models_:
        for field in model._meta.local_fields:
            if isinstance(field, TenantForeignKey):
                if not _declarable(field):
                    found.append(checks.Error(
                        f"{model._meta.label}.{field.name} is a TenantForeignKey, but "
                        f"{model._meta.label} or {field.related_model._meta.label} "
                        "is not a tenant-isolated model of yours with a tenant_id column "
                        "of its own: no reference that includes tenant_id can be written.",
                        hint="Use TenantForeignKey between models that both declare "
                        "tenant_isolated = True and have a tenant_id field; a plain "
                        "ForeignKey otherwise.",
                        obj=field, id="tenancy.E048",
                    ))
                continue
            constrained = getattr(field, "db_constraint", True)  # off: made by hand, or none
            if not isinstance(field, models.ForeignKey) or not constrained:
                continue
            target = field.related_model
            if declares_policy(model) and _tenant_isolated(target) and _has_tenant(target):
                found.append(checks.Warning(
                    f"{model._meta.label}.{field.name} is a plain foreign key to "
                    f"{target._meta.label}, another tenant-isolated model: PostgreSQL checks "
                    "it without row-level security, so a row of one tenant may refer to "
                    "another tenant's, and a refused write tells which ids exist.",
                    hint="Use tenancy.TenantForeignKey, whose constraint includes tenant_id "
                    "(for a one-to-one, with a UniqueConstraint on tenant_id and the field): "
                    "docs/roles.md.",
                    obj=field, id="tenancy.W047",
                ))
    return found


def register() -> None:
    """Called by ``TenancyConfig.ready()``."""
    checks.register(check_references, checks.Tags.models)
