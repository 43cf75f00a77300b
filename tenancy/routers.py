"""``AppDatabaseRouter``: the ORM's queries go where ``tenant_context`` sets the tenant."""

from __future__ import annotations

from typing import Any

from tenancy.aliases import tenant_alias, worker_alias
from tenancy.privileges import worker_tables


class AppDatabaseRouter:
    """Send every model's reads and writes to ``TENANCY["APP_DATABASE"]``.

    Django sends a query without ``using()`` to the alias ``"default"``.
    When the web process's alias has another name, a view's queries would
    run on ``default``, outside the transaction in which ``tenant_context``
    set the tenant: row-level security then shows nothing and refuses every
    insert. With this router they go to the app alias::

        DATABASES = {"default": {}, "app": {...}, "system": {...}, "owner": {...}}
        DATABASE_ROUTERS = ["tenancy.routers.AppDatabaseRouter"]
        TENANCY = {"APP_DATABASE": "app", ...}

    Inside a consumer's batch (``tenancy.aliases.working_as_worker``) the
    queries go to ``TENANCY["WORKER_DATABASE"]`` instead, where the batch's
    transaction is open: a handler's writes commit with its offset advance.

    A model whose table the privilege matrix opens to the worker role and
    not to the app role (:func:`tenancy.privileges.worker_tables`: the
    offsets, django-tasks-db's queue) goes to ``TENANCY["WORKER_DATABASE"]``
    always: its queries from the web process, the relay and the tasks' worker
    alike run as the role that may run them.

    A model instance read through another alias (``.using("system")``) is
    saved there again, as Django does without a router. Migrations are not
    routed: ``migrate --database owner`` decides where they run.
    """

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return self._route(model, hints)

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return self._route(model, hints)

    def _route(self, model: type[Any], hints: dict[str, Any]) -> str | None:
        instance = hints.get("instance")
        if instance is not None and getattr(instance, "_state", None) and instance._state.db:
            return None  # Django keeps the instance on the alias it came from
        if model._meta.db_table in worker_tables():
            return worker_alias()
        return tenant_alias()
