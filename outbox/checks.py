"""System checks of the outbox: can the Celery receivers keep their promise?

``manage.py check`` loads the Celery app the outbox sends to
(``OUTBOX["CELERY_APP"]``), imports its tasks' modules, and warns about each
receiver task (:func:`outbox.receiver`) whose settings let a message be lost
or run twice (:func:`outbox.celery.check_app`). A worker logs the same
warnings when it starts, with what only it can see (its broker's
persistence). Warnings, not errors: the web process and the workers may be
configured apart, and the worker's own warning is the one that sees its setup.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core import checks


def register() -> None:
    checks.register(check_receivers)


#: Set while the check imports the tasks' modules: Celery's Django fix-up runs
#: Django's system checks when task modules are imported, which would run this
#: check again, and import again, without end.
_importing = threading.local()


def check_receivers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if getattr(_importing, "active", False):
        return []
    try:
        from outbox import celery as outbox_celery
    except ImportError:  # Celery is an optional extra: no receivers to check
        return []
    _importing.active = True
    try:
        app = outbox_celery.celery_app()
        app.loader.import_default_modules()
        problems = outbox_celery.check_app(app)
    except Exception as exc:  # a broken task module must not break every manage.py command
        return [checks.Warning(
            f"Could not load the Celery app to check its outbox receivers: "
            f"{type(exc).__name__}: {exc}",
            hint='OUTBOX["CELERY_APP"] names the app (docs/settings.md).',
            id="outbox.W100",
        )]
    finally:
        _importing.active = False
    return [checks.Warning(p.message, hint=p.hint, id=p.id) for p in problems]
