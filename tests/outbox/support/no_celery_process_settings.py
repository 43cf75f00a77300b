"""The Django tasks settings in a project without Celery: importing Celery (or kombu,
its messaging library) fails, as where it is not installed.

The blocker goes in first, before Django loads an app; the test checks that
it held (no module of Celery's was loaded) at the end of each command.
"""

import atexit
import sys
from importlib.abc import MetaPathFinder

BLOCKED = ("celery", "kombu", "amqp", "billiard", "vine")


class NoCelery(MetaPathFinder):
    """Refuses Celery's packages, as an environment without them would."""

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: no Celery here)",
                                      name=name)
        return None


sys.meta_path.insert(0, NoCelery())


def _report() -> None:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(f"celery modules loaded: {loaded or 'none'}", file=sys.stderr, flush=True)


atexit.register(_report)

from tests.outbox.support.tasks_process_settings import *  # noqa: E402, F403
