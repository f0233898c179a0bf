"""Markdown references rendered from the code itself, so the docs cannot drift from it.

The documentation site's build hook (``docs/hooks.py``) replaces markers such as
``<!-- reference: config smartnsq.ConnectionConfig -->`` and
``<!-- reference: errors -->`` with the tables below. The same functions back
``python docs/reference.py`` for reading them in a terminal. This is the docs' own tooling: it
lives beside the pages, outside the installed package.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from typing import Any

from smartnsq import errors
from smartnsq.config import RETRY_CONCEPTS, describe
from smartnsq.errors import ERROR_TABLE, Action, ErrorSpec

__all__ = ["config_table", "errors_table", "exceptions_table", "expand_markers", "retries_table",
           "spark_table"]

_RETRY_CONFIGS = ("smartnsq.ConnectionConfig", "smartnsq.producer.config.ProducerConfig",
                  "smartnsq.ConsumerConfig", "smartnsq.LookupConfig")
"""The configs whose retry and back-off settings are listed side by side."""

_MARKER = re.compile(r"<!--\s*reference:\s*(\w+)\s*([\w.]*)\s*-->")

_ACTION_WORDS = {
    Action.REFRESH_AND_RETRY: "refresh lookup, retry",
    Action.RETRY: "retry after a back-off",
    Action.GIVE_UP: "give up (raise)",
}


def _load(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise TypeError(f"{dotted} is not a config dataclass")
    return obj


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    if isinstance(value, str):
        return f'`"{value}"`'
    if dataclasses.is_dataclass(value):
        return f"`{type(value).__name__}()`"
    return f"`{value!r}`"


def config_table(dotted: str) -> str:
    """A Markdown table of a config dataclass: option, default, unit and range, meaning."""
    cls = _load(dotted)
    lines = [
        f"`{dotted}`",
        "",
        "| option | default | unit / range | meaning |",
        "|---|---|---|---|",
    ]
    hidden = {f.name for f in dataclasses.fields(cls) if f.name.startswith("_") or not f.init}
    for row in describe(cls):
        if row.name in hidden:
            continue
        if row.default is dataclasses.MISSING:
            field = next(f for f in dataclasses.fields(cls) if f.name == row.name)
            default = (_default(field.default_factory())  # type: ignore[operator]
                       if field.default_factory is not dataclasses.MISSING else "required")
        else:
            default = _default(row.default)
        bounds = " ".join(x for x in (row.unit, row.range) if x)
        lines.append(f"| `{row.name}` | {_cell(default)} | {_cell(bounds)} | {_cell(row.doc)} |")
    return "\n".join(lines)


def _fatal(spec: ErrorSpec) -> str:
    if spec.fatal_on is None:
        return "always"
    if not spec.fatal_on:
        return "never"
    return "after " + ", ".join(sorted(spec.fatal_on))


def errors_table() -> str:
    """Every server error code: what it means, whether the server closes, what smartnsq does."""
    lines = [
        "| code | meaning | connection closed | smartnsq does | raised as |",
        "|---|---|---|---|---|",
    ]
    raised = {
        Action.REFRESH_AND_RETRY: "`RefreshLookupError`",
        Action.RETRY: "`RetriableServerError`",
        Action.GIVE_UP: "`NonRetriableServerError`",
    }
    for code in sorted(ERROR_TABLE):
        spec = ERROR_TABLE[code]
        lines.append(f"| `{code}` | {_cell(spec.meaning)} | {_fatal(spec)} "
                     f"| {_ACTION_WORDS[spec.action]} | {raised[spec.action]} |")
    return "\n".join(lines)


def exceptions() -> list[type[BaseException]]:
    """Every public exception class of :mod:`smartnsq.errors`, in the module's order."""
    names = [n for n in vars(errors) if not n.startswith("_")]
    return [obj for n in names if isinstance(obj := getattr(errors, n), type)
            and issubclass(obj, BaseException) and obj.__module__ == errors.__name__]


_RETRIABLE_PER_ANSWER = (errors.AdminError, errors.LookupdError)
"""Exceptions whose ``retriable`` each instance sets from the answer (its HTTP status)."""


def exceptions_table() -> str:
    """Every exception: what it also is (its bases) and its three flags, read from the classes
    themselves (a ``ServerError``'s ``fatal`` depends on the code and command: see the codes)."""
    lines = ["| exception | is a | `fatal` | `retriable` | `refresh_lookup` |",
             "|---|---|---|---|---|"]
    yes = {True: "yes", False: "no"}
    for cls in exceptions():
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__ if b is not Exception
                          and not b.__name__.startswith("_"))
        fatal = "per code" if issubclass(cls, errors.ServerError) else \
            yes[bool(getattr(cls, "fatal", False))]
        retriable = "per answer" if cls in _RETRIABLE_PER_ANSWER else \
            yes[bool(getattr(cls, "retriable", False))]
        lines.append(f"| `{cls.__name__}` | {bases or '`Exception`'} | {fatal} | {retriable} "
                     f"| {yes[bool(getattr(cls, 'refresh_lookup', False))]} |")
    return "\n".join(lines)


def retries_table() -> str:
    """Every retry and back-off setting, by concept (``doc(..., concept=...)``): the same
    concept under one name everywhere, each difference of default with its reason."""
    rows: dict[str, list[str]] = {key: [] for key in RETRY_CONCEPTS}
    for dotted in _RETRY_CONFIGS:
        cls = _load(dotted)
        for f in dataclasses.fields(cls):
            concept = f.metadata.get("concept", "")
            if concept:
                rows[concept].append(f"`{cls.__name__}.{f.name}` = {_default(f.default)} s")
    lines = ["| concept | settings and defaults | why |", "|---|---|---|"]
    for key, (title, why) in RETRY_CONCEPTS.items():
        lines.append(f"| {_cell(title)} | {'<br>'.join(rows[key])} | {_cell(why)} |")
    return "\n".join(lines)


def spark_table() -> str:
    """The numbers and switches of ``format("nsq")``, by the reader that takes them, from
    their declarations (``smartnsq.spark.options.Option``)."""
    from smartnsq.spark.options import OPTION_TABLES  # (the docs build only; no pyspark needed)

    lines = ["| reader | option | default | unit / range | meaning |", "|---|---|---|---|---|"]
    for reader, options in OPTION_TABLES.items():
        for option in options.values():
            default = option.default_text or (str(option.default).lower()
                                              if isinstance(option.default, bool)
                                              else f"{option.default:g}")
            bounds = " ".join(x for x in (option.unit, option.rule.text) if x)
            lines.append(f"| {reader} | `{option.name}` | {_cell(default)} | {_cell(bounds)} "
                         f"| {_cell(option.doc)} |")
    return "\n".join(lines)


def expand_markers(markdown: str) -> str:
    """Replace every reference marker in a page with its rendered table."""

    def render(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind == "config":
            return config_table(arg)
        if kind == "errors":
            return errors_table()
        if kind == "exceptions":
            return exceptions_table()
        if kind == "retries":
            return retries_table()
        if kind == "spark":
            return spark_table()
        raise ValueError(f"unknown reference marker {match.group(0)!r}")

    return _MARKER.sub(render, markdown)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] == "errors":
        print(errors_table())
    elif args[0] == "exceptions":
        print(exceptions_table())
    elif args[0] in ("retries", "spark"):
        print(retries_table() if args[0] == "retries" else spark_table())
    else:
        for dotted in args:
            print(config_table(dotted))
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
