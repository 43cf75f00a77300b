"""The docs keep up with the code: every setting and command is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.management import get_commands

from django_idempotency_outbox.conf import registered

DOCS = Path(__file__).resolve().parents[1] / "docs"
LIBRARY_APPS = {"tenancy", "idempotency", "outbox"}


def test_every_setting_is_documented_in_settings_md():
    text = (DOCS / "settings.md").read_text()
    missing = []
    for app_settings in registered():
        if f"`{app_settings.name}`" not in text:
            missing.append(app_settings.name)
        for key in app_settings.defaults:
            if not re.search(rf"^\| `{key}` \|", text, re.M):
                missing.append(f"{app_settings.name}[{key!r}]")
    assert missing == []


def _row(namespace: str, key: str, replacement: str) -> str:
    escaped = replacement.replace("|", "\\|")
    return f'| `{namespace}["{key}"]` | {escaped} |'


def test_every_removed_setting_is_in_the_removed_table_with_its_replacement():
    """A key a release removed is reported by check (tests/shared/test_conf.py) and listed."""
    text = (DOCS / "settings.md").read_text()
    table = text[text.index("## Removed settings"):]
    missing = [
        f"{s.name}[{key!r}]" for s in registered() for key, replacement in s.removed.items()
        if _row(s.name, key, replacement) not in table
    ]
    assert missing == []
    current = [f'`{s.name}["{key}"]`' for s in registered() for key in s.defaults]
    assert [name for name in current if name in table] == []


def test_every_command_is_documented_in_commands_md():
    text = (DOCS / "commands.md").read_text()
    ours = sorted(name for name, app in get_commands().items() if app in LIBRARY_APPS)
    assert "reap_idempotency_keys" in ours
    assert [name for name in ours if f"## `{name}`" not in text] == []


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_links_between_pages_resolve(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([a-z_]+\.md)(?:#[^)]*)?\)", text):
        assert (DOCS / target).exists(), f"{page} links to missing {target}"


@pytest.mark.parametrize("app, page", [("tenancy", "roles.md"), ("idempotency", "phases.md")])
def test_every_check_id_is_documented(app, page):
    """On the app's page, or among the settings' checks (docs/settings.md)."""
    source = (Path(__file__).resolve().parents[1] / app / "checks.py").read_text()
    ids = set(re.findall(rf'"({app}\.[EW]\d+)"', source))
    assert ids
    text = (DOCS / page).read_text() + (DOCS / "settings.md").read_text()
    assert sorted(i for i in ids if f"`{i}`" not in text) == []


def _nav_pages() -> list[str]:
    # mkdocs.yml is read as text: PyYAML belongs to the docs tools, not the test tools.
    text = (DOCS.parent / "mkdocs.yml").read_text()
    nav = re.search(r"^nav:\n((?:[ \t]+.*\n|\n)*)", text, re.M)
    assert nav, "mkdocs.yml has no nav"
    return re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*$", nav.group(1), re.M)


def test_every_page_is_in_the_mkdocs_nav():
    pages = _nav_pages()
    assert "index.md" in pages
    on_disk = sorted(p.name for p in DOCS.glob("*.md"))
    assert [p for p in on_disk if p not in pages] == [], "pages missing from mkdocs.yml's nav"
    assert [p for p in pages if not (DOCS / p).exists()] == [], "nav names missing pages"


def test_every_outbox_check_id_is_documented():
    # The receivers' warnings on the outbox page, the fence's errors (and the
    # deployment's warning, outbox.W003) in the operations page's table of checks.
    root = Path(__file__).resolve().parents[1] / "outbox"
    source = (root / "checks.py").read_text() + (root / "celery.py").read_text()
    ids = set(re.findall(r'"(outbox\.[EWI]\d+)"|\((outbox\.[EWI]\d+)\)', source))
    found = {a or b for a, b in ids}
    assert {"outbox.W100", "outbox.W105", "outbox.E001", "outbox.E002"} <= found
    settings_page = (DOCS / "settings.md").read_text()
    operations = (DOCS / "operations.md").read_text()
    pages = {"W": (DOCS / "outbox.md").read_text() + operations,
             "E": operations + settings_page, "I": operations}
    assert sorted(i for i in found if f"`{i}`" not in pages[i[7]]) == []


def test_every_test_that_needs_direct_sessions_says_why():
    """docs/scaling.md: such a test says why in its mark, and its skip shows the reason."""
    import ast

    tests = Path(__file__).resolve().parent
    marks = []
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "direct_sessions"):
                marks.append((path.name, {k.arg for k in node.keywords}))
    assert len(marks) >= 5, marks
    assert [name for name, keywords in marks if "reason" not in keywords] == []
