"""Per-collector settings as `--collector.NAME.SETTING` flags, the way node_exporter has them.

A collector declares its settings as a frozen dataclass whose fields are made by `setting()`
and names that class when it registers; the framework makes each field a flag in the
collector's `--help` group and hands the collector the parsed values through its context.
A value comes from the flag, else from the field's environment variable (kept so tests can
shorten a cycle of every exporter they start without knowing its flags), else the default.
A bad value is an error that names the flag or the variable, never silently the default.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound="DataclassInstance")
Parse = Callable[[str], Any]


def setting(
    default: Any, help: str, parse: Parse, *, env: str | None = None, metavar: str = "VALUE"
) -> Any:
    """A settings field: its default, its help, how to read a value, and its variable."""
    metadata = {"help": help, "parse": parse, "env": env, "metavar": metavar}
    return dataclasses.field(default=default, metadata=metadata)


# --- values ----------------------------------------------------------------------------------


def positive_seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("must be positive")
    return value


def byte_count(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("is not a whole number of bytes") from None
    if value < 0:
        raise ValueError("must not be negative")
    return value


def one_of(*choices: str) -> Parse:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(f"is not one of {', '.join(choices)}")
        return raw

    parse.__name__ = "one_of"
    return parse


# --- flags -----------------------------------------------------------------------------------


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag_name(collector: str, field: str) -> str:
    return f"--collector.{collector}.{field.replace('_', '-')}"


def _dest(collector: str, field: str) -> str:
    return f"collector.{collector}.{field}"


def _flag_type(parse: Parse) -> Parse:
    """argparse's `type`: its error names the flag; ours says what is wrong with the value."""

    def convert(raw: str) -> Any:
        try:
            return parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{raw!r} {exc}") from None

    return convert


def add_flags(
    group: argparse._ArgumentGroup, collector: str, kind: type[DataclassInstance]
) -> None:
    """One flag per settings field; unset flags stay None so the variable can still count."""
    for field in dataclasses.fields(kind):
        meta = field.metadata
        env = f"; or ${meta['env']}" if meta["env"] else ""
        group.add_argument(
            flag_name(collector, field.name),
            dest=_dest(collector, field.name),
            type=_flag_type(meta["parse"]),
            default=None,
            metavar=meta["metavar"],
            help=f"{meta['help']} (default {_shown(field.default)}{env})",
        )


def read_settings(
    kind: type[S],
    given: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> S:
    """The settings: each from `given` (parsed flags), else its variable, else its default."""
    given = given or {}
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in dataclasses.fields(kind):
        if given.get(field.name) is not None:
            values[field.name] = given[field.name]
            continue
        variable = field.metadata["env"]
        raw = environ.get(variable, "") if variable else ""
        if raw:
            try:
                values[field.name] = field.metadata["parse"](raw)
            except ValueError as exc:
                raise ValueError(f"{variable}={raw!r} {exc}") from None
    return kind(**values)


def settings_from_args(args: argparse.Namespace, collector: str, kind: type[S]) -> S:
    fields = dataclasses.fields(kind)
    given = {f.name: getattr(args, _dest(collector, f.name), None) for f in fields}
    return read_settings(kind, given)


def describe(settings: DataclassInstance) -> str:
    """`interval=60s`-style words for the landing page and the log."""
    return ", ".join(
        f"{field.name.replace('_', '-')}={_shown(getattr(settings, field.name))}"
        for field in dataclasses.fields(settings)
    )
