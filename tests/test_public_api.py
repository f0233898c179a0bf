"""One import path per public name (docs/api.md), no re-exports, every exception documented.

The public surfaces are the root package (the client API), :mod:`smartnsq.errors` (every
exception), and the packages that are products of their own (``smartnsq.devcluster``,
``smartnsq.compat``, ``smartnsq.spark``, and ``smartnsq.cli``, whose ``main`` is the
command). Every other module's ``__all__`` names only what the
module defines, and every other package's ``__init__`` is its docstring alone, so a name has
one home and the docs and examples import it from there.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import smartnsq
from smartnsq import errors

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = (ROOT / "docs" / "api.md").read_text()
ERRORS_PAGE = (ROOT / "docs" / "errors.md").read_text()
# smartnsq.compat.pynsq stands for pynsq's ``nsq`` package, whose __init__ gathers the names
# of its modules (nsq.Message from nsq.message, nsq.pub from nsq.protocol...)
SURFACES = {"smartnsq", "smartnsq.devcluster", "smartnsq.compat", "smartnsq.compat.pynsq",
            "smartnsq.spark", "smartnsq.cli", "smartnsq.admin"}
OPTIONAL = ("smartnsq.spark", "smartnsq.testing.spark")  # need pyspark


def _modules() -> list[str]:
    import smartnsq.compat

    names = [m.name for m in pkgutil.walk_packages(smartnsq.__path__, "smartnsq.")]
    # smartnsq.compat is shipped from compat/ (package-dir): walked on its own path
    names += [m.name for m in pkgutil.walk_packages(smartnsq.compat.__path__,
                                                    "smartnsq.compat.")]
    return [*sorted(set(n for n in names if not n.startswith(OPTIONAL))), "smartnsq"]


def _root_names() -> set[str]:
    return set(smartnsq.__all__) - {"__version__"}


def _exceptions() -> list[type[BaseException]]:
    return [obj for name in errors.__all__ if isinstance(obj := getattr(errors, name), type)
            and issubclass(obj, BaseException)]


def test_the_root_exports_what_the_api_page_lists() -> None:
    row = next(line for line in API_PAGE.splitlines() if line.startswith("| `from smartnsq import"))
    listed = set(re.findall(r"`(\w+)`", row.split("|")[2])) - {"__version__"}
    assert listed == _root_names()
    for name in _root_names():
        assert getattr(smartnsq, name) is not None
        assert name in dir(smartnsq)


def test_every_exception_lives_in_errors_and_is_documented() -> None:
    table = ERRORS_PAGE.split("## Each exception", 1)[1].split("\n## ", 1)[0]
    documented = {name for line in table.splitlines() if line.startswith("| `")
                  for name in re.findall(r"`(\w+)`", re.sub(r"\(also [^)]*\)", "",
                                                             line.split("|")[1]))}
    names = {cls.__name__ for cls in _exceptions()}
    assert names - {"NSQError"} <= documented, sorted(names - documented - {"NSQError"})
    assert documented <= names, sorted(documented - names)
    for module in _modules():
        if module == "smartnsq.errors":
            continue
        for name, obj in vars(importlib.import_module(module)).items():
            if isinstance(obj, type) and issubclass(obj, errors.NSQError) \
                    and obj.__module__ == module:
                pytest.fail(f"{module}.{name} is an NSQError defined outside smartnsq.errors")


def _defined_elsewhere(module: str, name: str) -> str | None:
    obj = getattr(importlib.import_module(module), name, None)
    if inspect.ismodule(obj) or not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return None
    home = obj.__module__
    if home in ("typing", "collections.abc", "builtins", "abc") or home == module:
        return None
    return home


@pytest.mark.parametrize("module", [m for m in _modules() if m not in SURFACES])
def test_a_module_exports_only_what_it_defines(module: str) -> None:
    exported = getattr(importlib.import_module(module), "__all__", [])
    foreign = {name: home for name in exported
               if (home := _defined_elsewhere(module, name)) is not None}
    assert not foreign, f"{module} re-exports {foreign}: import them from their homes"


def test_a_package_that_is_no_surface_holds_its_docstring_only() -> None:
    for init in sorted((ROOT / "smartnsq").rglob("__init__.py")):
        parts = init.relative_to(ROOT).parent.parts
        package = ".".join(parts)
        if package in SURFACES:
            continue
        body = ast.parse(init.read_text()).body
        rest = [node for node in body if not (isinstance(node, ast.Expr)
                                              and isinstance(node.value, ast.Constant))]
        assert not rest, f"{package}/__init__.py holds code besides its docstring"


_IMPORT = re.compile(r"from (smartnsq(?:\.\w+)*) import (\([\w ,\n#]+\)|[\w ,]+)")


def _user_code() -> list[tuple[str, str]]:
    files = [*sorted((ROOT / "examples").glob("*.py")), ROOT / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    return [(str(path.relative_to(ROOT)), path.read_text()) for path in files]


@pytest.mark.parametrize(("where", "text"), _user_code(), ids=[w for w, _ in _user_code()])
def test_docs_and_examples_import_each_name_from_its_one_path(where: str, text: str) -> None:
    root = _root_names()
    wrong = []
    for module, names in _IMPORT.findall(text):
        for name in re.findall(r"\w+", re.sub(r"#[^\n]*", "", names)):
            if name in root and module != "smartnsq":
                wrong.append(f"{name} from {module} (use: from smartnsq import {name})")
            if module == "smartnsq" and hasattr(errors, name) and name not in root:
                wrong.append(f"{name} from smartnsq (use: from smartnsq.errors import {name})")
    assert not wrong, f"{where}: {wrong}"
