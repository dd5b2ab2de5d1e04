"""Loading the inventory, with the line of every error.

The file may write `nodes:` and `models:` as mappings keyed by name (the readable form)
or as lists; either way each error names the line the user wrote, the field and what is
wrong, all at once (`InventoryError`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mlx_medic.inventory.methods import InventoryError
from mlx_medic.inventory.schema import Inventory

# Top-level lists that the file may also write as mappings keyed by each entry's name.
KEYED_SECTIONS = ("nodes", "models")


def _line_index(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[(*path, key)] = key_node.start_mark.line + 1
            _line_index(value_node, (*path, key), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_index(item, (*path, index), out)


def _normalise(raw: Any) -> tuple[Any, dict[tuple[Any, ...], tuple[Any, ...]]]:
    """Accept `nodes:`/`models:` as mappings keyed by name (the readable form).

    Returns the data in list form and a map from list paths back to the
    mapping paths, so errors point at the lines the user wrote.
    """
    back: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    if not isinstance(raw, dict):
        return raw, back
    data = dict(raw)
    for section in KEYED_SECTIONS:
        value = data.get(section)
        if isinstance(value, dict):
            items = []
            for index, (name, body) in enumerate(value.items()):
                entry = dict(body) if isinstance(body, dict) else body
                if isinstance(entry, dict):
                    entry.setdefault("name", name)
                items.append(entry)
                back[(section, index)] = (section, name)
            data[section] = items
    return data, back


def _error_location(loc: tuple[Any, ...], back: dict[tuple[Any, ...], tuple[Any, ...]]) -> tuple:
    if len(loc) >= 2 and (loc[0], loc[1]) in back:
        return back[(loc[0], loc[1])] + tuple(loc[2:])
    return tuple(loc)


def _format_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


# Keys of the seed's own inventory that mean one of our fields.
_SEED_KEYS = {
    ("models", "extra_params"): "`serve_args` (the seed's `extra_params`: the same flags"
    " without dashes, e.g. `serve_args: {prefill-step-size: 2048}`)",
}


def _unknown_field(loc: tuple[Any, ...]) -> str:
    if len(loc) == 3 and (loc[0], loc[2]) in _SEED_KEYS:
        return f"unknown field: mlx-medic calls it {_SEED_KEYS[(loc[0], loc[2])]}"
    return "unknown field (check the spelling)"


# libyaml's loader where PyYAML has it: every node helper loads the inventory at start.
_FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _line_numbers(text: str) -> dict[tuple[Any, ...], int]:
    """Each key path's line, for error messages (composed only when there is an error)."""
    lines: dict[tuple[Any, ...], int] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        _line_index(root, (), lines)
    return lines


def parse_inventory(text: str, source: str = "<inventory>") -> Inventory:
    try:
        raw = yaml.load(text, Loader=_FAST_SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise InventoryError(source, [f"{where}not valid YAML: {exc}"]) from exc
    if raw is None:
        raise InventoryError(source, ["the file is empty; it needs at least `nodes:`"])
    if not isinstance(raw, dict):
        raise InventoryError(
            source, ["the top level must be a mapping with `nodes:` and `models:`"]
        )
    data, back = _normalise(raw)
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        lines = _line_numbers(text)
        problems = []
        for error in exc.errors():
            loc = _error_location(tuple(error["loc"]), back)
            line = None
            probe = loc
            while probe and line is None:
                line = lines.get(probe)
                probe = probe[:-1]
            where = f"line {line}: " if line else ""
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = _unknown_field(loc)
            problems.append(f"{where}{_format_loc(loc)}: {message}")
        raise InventoryError(source, problems) from exc


def load_inventory(path: str | Path) -> Inventory:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(str(path), [f"cannot read: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise InventoryError(str(path), [f"not UTF-8 text: {exc}"]) from exc
    return parse_inventory(text, str(path))
