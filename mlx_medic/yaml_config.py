"""Reading a YAML config file into its pydantic model, with the place of every error.

The inventory (`mlx_medic.inventory.load`) and the remediator's config
(`mlx_medic.remediator.config`) are both read here, so both say a problem alike and all
at once: the line and column the user wrote, the field's path, the value as written
(unless the message already quotes it) and what is wrong. A file of the other kind is
named as such (`mlx_medic.config_kind`). The line index is composed only when there is
an error: every node helper loads the inventory at start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from mlx_medic.config_kind import EMPTY_FILE, TOP_LEVEL, Kind, mixup
from mlx_medic.file_problems import FileProblems

ErrorT = TypeVar("ErrorT", bound=FileProblems)
ModelT = TypeVar("ModelT", bound=BaseModel)
Loc = tuple[Any, ...]

# libyaml's loader where PyYAML has it: every node helper loads the inventory at start.
_FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_VALUE_WIDTH = 60  # a value longer than this is shortened in a message


def read_text(path: Path, source: str, error: type[ErrorT]) -> str:
    """The file's text; a file that cannot be read is `unreadable`, one that is not
    UTF-8 was read and is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(source, [f"cannot read: {exc.strerror or exc}"], unreadable=True) from exc
    except UnicodeDecodeError as exc:
        raise error(source, [f"not UTF-8 text: {exc}"]) from exc
    if "\x00" in text:
        raise error(source, ["not a text file: it has NUL bytes"])
    return text


def parse_mapping(text: str, source: str, error: type[ErrorT], kind: Kind | None) -> dict:
    """The file's top-level mapping; bad YAML, an empty file or another top level is an
    `error` that says which (in `kind`'s words)."""
    try:
        raw = yaml.load(text, Loader=_FAST_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise error(source, [_yaml_problem(exc)]) from exc
    if raw is None:
        raise error(source, [EMPTY_FILE[kind]])
    if not isinstance(raw, dict):
        raise error(source, [TOP_LEVEL[kind]])
    return raw


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return f"not valid YAML: {str(exc).splitlines()[0]}"
    mark = exc.problem_mark
    context = ""
    if exc.context and exc.context_mark is not None:
        context = f" ({exc.context} at line {exc.context_mark.line + 1})"
    return f"{_where(mark.line + 1, mark.column + 1)}not valid YAML: {exc.problem}{context}"


def _where(line: int, column: int) -> str:
    return f"line {line}, column {column}: "


def unknown_field(loc: Loc) -> str:
    return "unknown field (check the spelling)"


def validate(
    model: type[ModelT],
    data: dict,
    text: str,
    source: str,
    error: type[ErrorT],
    *,
    kind: Kind,
    path: str,
    written: Callable[[Loc], Loc] = tuple,
    unknown: Callable[[Loc], str] = unknown_field,
) -> ModelT:
    """`data` (parsed from `text`) as `model`, else an `error` listing every problem at
    the place the file wrote it. `written` maps a model's error location back to the
    file's keys (where the loader reshaped the data), `unknown` says what an unknown key
    is; `kind` and `path` name the file when it is plainly the other kind."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        places = _places(text)
        found = [_problem(e, written(tuple(e["loc"])), places, unknown) for e in exc.errors()]
        problems = [said for _, said in sorted(found, key=lambda f: f[0])]  # in file order
        raise error(source, problems, headline=mixup(data, kind, path)) from exc


@dataclass(frozen=True)
class _Place:
    line: int
    column: int
    value: str | None  # the scalar as the file wrote it, when the path's value is one


def _places(text: str) -> dict[Loc, _Place]:
    """Each key path's place: a key's own, a list item's start."""
    places: dict[Loc, _Place] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        _index(root, (), root.start_mark, text, places)
    return places


def _index(node: yaml.Node, path: Loc, mark: Any, text: str, out: dict[Loc, _Place]) -> None:
    out[path] = _Place(mark.line + 1, mark.column + 1, _as_written(node, text))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                _index(value_node, (*path, key_node.value), key_node.start_mark, text, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index(item, (*path, index), item.start_mark, text, out)


def _as_written(node: yaml.Node, text: str) -> str | None:
    if not isinstance(node, yaml.ScalarNode):
        return None
    written = text[node.start_mark.index : node.end_mark.index]
    if not written or "\n" in written:
        return None
    return written if len(written) <= _VALUE_WIDTH else written[: _VALUE_WIDTH - 3] + "..."


def _problem(
    error: ErrorDetails, loc: Loc, places: dict[Loc, _Place], unknown: Callable[[Loc], str]
) -> tuple[tuple[int, int], str]:
    """(the place to sort by, the problem as said); a problem without a place goes last."""
    place = None
    probe = loc
    while place is None and probe:  # a missing key's place is its parent's
        place = places.get(probe)
        probe = probe[:-1]
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = unknown(loc)
    said = f"{_where(place.line, place.column) if place else ''}{_format_loc(loc)}: "
    quoted = isinstance(error.get("input"), str) and repr(error["input"]) in message
    if place is not None and place.value is not None and not quoted:
        said += f"{place.value}: "
    return (place.line, place.column) if place else (1 << 30, 0), said + message


def _format_loc(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"
