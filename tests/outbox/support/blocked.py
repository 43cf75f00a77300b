"""Packages made unimportable in a test's process, as where they are not installed.

``block("celery", "kombu")`` puts a finder first on ``sys.meta_path`` that
refuses them (and their submodules), and has the process print, when it
exits, which of them were loaded all the same (``<label> modules loaded:
none`` when the blocker held).
"""

import atexit
import sys
from importlib.abc import MetaPathFinder


class Blocked(MetaPathFinder):
    """Refuses the packages named, as an environment without them would."""

    def __init__(self, names: tuple[str, ...], why: str) -> None:
        self.names = names
        self.why = why

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: {self.why})",
                                      name=name)
        return None


def block(*names: str, why: str, label: str) -> None:
    sys.meta_path.insert(0, Blocked(names, why))

    def report() -> None:
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in names)
        print(f"{label} modules loaded: {loaded or 'none'}", file=sys.stderr, flush=True)

    atexit.register(report)
