"""The library touches no private name of Django, psycopg, Celery or kombu.

A name that starts with an underscore is a project's own business: a release
may rename or drop it and the library would break, or worse, go on running
against an attribute nobody reads any more. Every ``._name`` in the library's
code must be a name the library itself defines, or one of the few public
names that merely start with an underscore (listed here, each with why).
Hooks Django does not offer live in the library's database backend, which
overrides the methods Django calls on every backend (docs/contributing.md).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("idempotency", "outbox", "tenancy", "django_idempotency_outbox")

#: Names that start with "_" but are public, each with why.
PUBLIC = {
    "_meta": "Django's documented Model _meta API",
    "_state": "Django's documented Model._state (the instance's database, routers read it)",
}

#: The methods Django calls on a database backend to begin a transaction and to make,
#: release and roll back savepoints: a backend implements them, and only the library's
#: backend may (tests/tenancy/test_backend.py holds them on the oldest and newest Django).
BACKEND_HOOKS = {
    "_start_transaction_under_autocommit", "_set_autocommit", "_savepoint",
    "_savepoint_commit", "_savepoint_rollback", "_commit", "_rollback",
}
BACKEND = ROOT / "tenancy" / "backends"

#: What the retired hot path used, by name (issue 27): none may come back.
RETIRED = (
    r"\.savepoint_ids\b", r"\.atomic_blocks\b", r"\.savepoint_state\b", r"\._autocommit\b",
    r"\._results\b", r"\._wrapped\b", r"_get_tx_start_command", r"pgconn\.exec_",
    r"transaction\.Atomic\b", r"\._put\b", r"_inplace_augment_message", r"_q_for_pri",
    r"_basic_publish", r"_prepare_cursor",
)


def library_files() -> list[Path]:
    return [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
            if "migrations" not in path.parts]


def defined_names(files: list[Path]) -> set[str]:
    """Every underscore name the library defines: functions, classes, attributes, fields."""
    pattern = re.compile(
        r"(?:def|class)\s+(_\w+)|self\.(_\w+)\s*[:=]|^\s+(_\w+)\s*[:=]|^(_\w+)\s*[:=]",
        re.MULTILINE,
    )
    found: set[str] = set()
    for path in files:
        for groups in pattern.findall(path.read_text()):
            found.update(name for name in groups if name)
    return found


def test_no_private_name_of_another_project_is_read_or_written():
    files = library_files()
    ours = defined_names(files)
    foreign = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for name in re.findall(r"\.(_[a-z]\w*)", code):
                if name in ours or name in PUBLIC:
                    continue
                if name in BACKEND_HOOKS and BACKEND in path.parents:
                    continue
                foreign.append(f"{path.relative_to(ROOT)}:{number}: .{name}")
            for name in re.findall(r"^from\s+(?!idempotency|outbox|tenancy|django_idempot)\S+"
                                   r"\s+import\s+.*?\b(_\w+)", code):
                foreign.append(f"{path.relative_to(ROOT)}:{number}: imports {name}")
    assert foreign == []


def test_what_the_retired_hot_path_used_is_gone():
    found = [f"{path.relative_to(ROOT)}: {pattern}" for path in library_files()
             for pattern in RETIRED if re.search(pattern, path.read_text())]
    assert found == []


def test_the_scan_finds_a_private_name():
    ours = defined_names(library_files())
    assert "_send_held" in ours and "_set_autocommit" not in ours  # Django's, not ours
