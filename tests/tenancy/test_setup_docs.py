"""What the adoption pages say about commands, roles and grants is what the code does.

- Every option the docs give a library command (``outbox_parked --redrive``)
  is one the command accepts.
- Consumers' handlers run on the worker role (a handler asks the database),
  and no page says they run on the app role.
- ``relay_outbox``'s section names both roles it uses; the README's count of
  its make targets is right.
- With ``GRANT_PROJECT_TABLES`` off, a table of yours the app role cannot
  touch is a warning of ``check`` (``tenancy.W028``), not "no issues", and the
  installation page says how the grants happen.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class
from django.db import connections, router
from django.test import override_settings

from outbox import Consumer
from outbox.consumers import ensure_offsets, run_batch
from tenancy.aliases import app_alias
from tenancy.checks import check_project_privileges
from tenancy.privileges import apply, role_names
from tests.helpers import observer
from tests.outbox.support.helpers import publish_many
from tests.testapp.models import Order

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md"]
LIBRARY_APPS = {"tenancy", "idempotency", "outbox"}


def _options(app: str, name: str) -> set[str]:
    parser = load_command_class(app, name).create_parser("manage.py", name)
    return {option for action in parser._actions for option in action.option_strings}


def _mentions() -> list[tuple[str, str, str]]:
    """(page, command, option) for each option written after a library command's name."""
    ours = {name: app for name, app in get_commands().items() if app in LIBRARY_APPS}
    found = []
    for page in PAGES:
        text = page.read_text()
        # inline code spans, and the lines of console blocks
        spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"^\$ (.*)$", text, re.M)
        for span in spans:
            for m in re.finditer(rf"\b({'|'.join(ours)})\b((?:\s+[^\s|;>&]+)*)", span):
                for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", m.group(2)):
                    found.append((page.name, m.group(1), option))
    return found


def test_every_option_the_docs_give_a_command_is_one_it_accepts():
    mentions = _mentions()
    assert ("roles.md", "outbox_parked", "--redrive") in mentions
    commands = get_commands()
    wrong = sorted({(page, command, option) for page, command, option in mentions
                    if option not in _options(commands[command], command)})
    assert wrong == []


class WhoRuns(Consumer):
    name = "docs-who-runs"
    topics = ["docs.who-runs"]
    roles: list[str] = []

    def handle(self, message):
        alias = router.db_for_write(Order)  # where the ORM sends the handler's writes
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT current_user")
            self.roles.append(cursor.fetchone()[0])


def test_consumers_handlers_run_on_the_worker_role_and_the_docs_say_so():
    publish_many(1, "docs.who-runs", [{}])
    consumer = WhoRuns()
    ensure_offsets(consumer)
    assert run_batch(consumer).handled == 1
    assert WhoRuns.roles == [role_names()["worker"]]

    wrong = []
    for page in PAGES:
        for sentence in re.split(r"(?<=[.;:])\s+|\n\n|\|", page.read_text()):
            flat = " ".join(sentence.split())
            if re.search(r"re-?drive", flat):
                continue  # outbox_parked --redrive does run handlers on the app alias
            if re.search(r"handlers?\b.*\b(run|runs|execute)\b.*\bon the app (role|alias)", flat) \
                    or re.search(r"consumers' handlers run here", flat):
                wrong.append((page.name, flat))
    assert wrong == []


def test_the_relay_section_names_both_roles_it_uses():
    text = (ROOT / "docs" / "commands.md").read_text()
    section = " ".join(text.split("## `relay_outbox`", 1)[1].split("\n## ", 1)[0].split())
    assert "worker role" in section and "system role" in section


def test_the_readme_counts_its_make_targets():
    text = (ROOT / "README.md").read_text()
    block, after = re.search(r"```console\n(.*?)```\n\n(\w+ \w+(?: need)?)", text, re.S).groups()
    targets = len(re.findall(r"^\$ make ", block, re.M))
    words = {2: "Both need", 3: "All three need", 4: "All four need"}
    assert after == words[targets]


@pytest.fixture
def bare_table():
    names = role_names()
    with observer() as conn:
        conn.execute(f'REVOKE ALL ON testapp_plain_order FROM "{names["app"]}"')
    yield "testapp_plain_order"
    apply("owner")


def test_a_table_the_app_role_cannot_touch_is_a_warning_when_migrate_does_not_grant(bare_table):
    tenancy = {**__import__("django.conf").conf.settings.TENANCY, "GRANT_PROJECT_TABLES": False}
    with override_settings(TENANCY=tenancy):
        found = check_project_privileges(databases=[app_alias()])
    assert [m.id for m in found] == ["tenancy.W028"]
    assert bare_table in found[0].msg and "GRANT_PROJECT_TABLES" in found[0].hint
    # With the opt-in on, migrate grants it and this check has nothing to say.
    assert check_project_privileges(databases=[app_alias()]) == []
    page = (ROOT / "docs" / "installation.md").read_text()
    assert "GRANT_PROJECT_TABLES" in page and "tenancy.W028" in page
