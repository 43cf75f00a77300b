"""The test settings with the aliases renamed: the library must follow TENANCY, not ``default``.

``make test-app-alias`` runs the tenancy, idempotency and outbox suites with
these settings:

- ``app`` is the app role (``TENANCY["APP_DATABASE"]``), ``consumers`` the
  worker role (``TENANCY["WORKER_DATABASE"]``) and ``upkeep`` the system role
  (``TENANCY["SYSTEM_DATABASE"]``); ``owner`` is unchanged.
- ``default``, ``worker`` and ``system`` stay only as inert entries: Django's dummy
  backend, which refuses every query, so any code that still sends a query
  to either name fails at once. They keep the connection details because the
  harness (tests/dbsetup.py, tests/helpers.py) reads the roles' and the
  database's names from them for its raw connections.
- ``tenancy.routers.AppDatabaseRouter`` sends the ORM to ``app``, as
  docs/settings.md tells a project whose app alias is not ``default`` to do.
"""

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _DATABASES
from tests.settings import POOLED_ALIASES as _POOLED_ALIASES
from tests.settings import TENANCY as _TENANCY


def _inert(database: dict) -> dict:
    return {**database, "ENGINE": "django.db.backends.dummy"}


DATABASES = {
    "default": _inert(_DATABASES["default"]),
    "worker": _inert(_DATABASES["worker"]),
    "system": _inert(_DATABASES["system"]),
    "app": _DATABASES["default"],
    "consumers": _DATABASES["worker"],
    "upkeep": _DATABASES["system"],
    "owner": _DATABASES["owner"],
}
DATABASE_ROUTERS = ["tenancy.routers.AppDatabaseRouter"]
TENANCY = {
    **_TENANCY, "APP_DATABASE": "app", "WORKER_DATABASE": "consumers", "SYSTEM_DATABASE": "upkeep",
}

#: The aliases DIO_POOLED puts behind pgbouncer, by both names: the new one (what the
#: library and the helpers ask about) and the old one (what a test's direct_sessions
#: marker may name).
_RENAMED = {"default": "app", "worker": "consumers", "system": "upkeep"}
POOLED_ALIASES = _POOLED_ALIASES | {_RENAMED[alias] for alias in _POOLED_ALIASES}
