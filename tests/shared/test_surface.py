"""The declared public surface: what users and the docs import."""

import importlib
import re
from pathlib import Path

import pytest

import django_idempotency_outbox
from django_idempotency_outbox.errors import IdempotencyOutboxError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["tenancy", "idempotency", "outbox"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
    assert module.__version__ == django_idempotency_outbox.__version__


@pytest.mark.parametrize("package", PACKAGES)
def test_every_error_derives_from_the_library_base(package):
    module = importlib.import_module(package)
    errors = [getattr(module, n) for n in module.__all__ if n.endswith(("Error", "Refused"))]
    assert errors
    for error in errors:
        assert issubclass(error, IdempotencyOutboxError), error


@pytest.mark.parametrize("package", [*PACKAGES, "django_idempotency_outbox"])
def test_packages_ship_their_type_information(package):
    assert (ROOT / package / "py.typed").exists()


def test_the_docs_import_only_public_names():
    """Every ``from <package>... import`` in the docs names something in ``__all__``."""
    pattern = re.compile(r"^\s*from (tenancy|idempotency|outbox)(\.[\w.]+)? import ([^\n]+)$",
                         re.M)
    offenders = []
    for page in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for package, submodule, names in pattern.findall(page.read_text()):
            public = importlib.import_module(package).__all__
            for name in re.split(r"\s*,\s*", names.strip("() ")):
                name = name.split(" as ")[0].strip()
                if submodule or name not in public:
                    offenders.append(f"{page.name}: from {package}{submodule} import {name}")
    assert offenders == []
