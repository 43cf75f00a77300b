"""The declared public surface: what users and the docs import."""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

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


def _kind(name: str) -> str:
    """What the docs say a public name is: a class (CamelCase), a constant
    (UPPER_CASE, ``__version__``) or a function (snake_case)."""
    if name == "__version__" or name.isupper():
        return "constant"
    return "class" if name[0].isupper() else "function"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_what_the_docs_say_it_is(package):
    """``from outbox import status`` is the function, not the submodule of that name.

    Importing a submodule sets the package's attribute of the same name, which
    shadows the lazy export for good: so every submodule is imported first
    (as a running process will have done), then each name of ``__all__`` must
    still be the class, function or constant of that name.
    """
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, f"{package}."):
        importlib.import_module(info.name)
    wrong = []
    for name in module.__all__:
        value = getattr(module, name)
        kind = _kind(name)
        if isinstance(value, ModuleType):
            wrong.append(f"{package}.{name} is the module {value.__name__}")
        elif kind == "class" and not inspect.isclass(value):
            wrong.append(f"{package}.{name} is not a class: {value!r}")
        elif kind == "function" and not (callable(value) and not inspect.isclass(value)):
            wrong.append(f"{package}.{name} is not a function: {value!r}")
        elif kind == "constant" and not isinstance(value, str):
            wrong.append(f"{package}.{name} is not a constant: {value!r}")
        elif kind != "constant" and getattr(value, "__name__", name) != name:
            wrong.append(f"{package}.{name} is {value.__name__}")
    assert wrong == []


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


def test_the_docs_snippets_get_functions_not_modules():
    """The snippets of docs/operations.md and docs/mixin.md call what they import."""
    from idempotency import canonical_path, fingerprint
    from outbox import observe, status

    for value in (status, observe, fingerprint, canonical_path):
        assert inspect.isfunction(value), value
    assert fingerprint("POST", canonical_path("/orders", ""), "u1", {"a": 1}) == fingerprint(
        "POST", "/orders", "u1", {"a": 1})
