"""Loading the inventory, with the line of every error.

The file may write `nodes:` and `models:` as mappings keyed by name (the readable form)
or as lists; either way each error names the line the user wrote, the field and what is
wrong, all at once (`InventoryError`, by `mlx_medic.yaml_config` as the remediator's
config says its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlx_medic.inventory.methods import InventoryError
from mlx_medic.inventory.schema import Inventory
from mlx_medic.yaml_config import parse_mapping, read_text, unknown_field, validate

# Top-level lists that the file may also write as mappings keyed by each entry's name.
KEYED_SECTIONS = ("nodes", "models")


def _normalise(raw: dict) -> tuple[dict, dict[tuple[Any, ...], tuple[Any, ...]]]:
    """Accept `nodes:`/`models:` as mappings keyed by name (the readable form).

    Returns the data in list form and a map from list paths back to the
    mapping paths, so errors point at the lines the user wrote.
    """
    back: dict[tuple[Any, ...], tuple[Any, ...]] = {}
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


# Keys of the seed's own inventory that mean one of our fields.
_SEED_KEYS = {
    ("models", "extra_params"): "`serve_args` (the seed's `extra_params`: the same flags"
    " without dashes, e.g. `serve_args: {prefill-step-size: 2048}`)",
}


def _unknown_field(loc: tuple[Any, ...]) -> str:
    if len(loc) == 3 and (loc[0], loc[2]) in _SEED_KEYS:
        return f"unknown field: mlx-medic calls it {_SEED_KEYS[(loc[0], loc[2])]}"
    return unknown_field(loc)


def parse_inventory(text: str, source: str = "<inventory>") -> Inventory:
    raw = parse_mapping(text, source, InventoryError, "inventory")
    data, back = _normalise(raw)

    def written(loc: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(loc) >= 2 and (loc[0], loc[1]) in back:
            return back[(loc[0], loc[1])] + tuple(loc[2:])
        return tuple(loc)

    return validate(
        Inventory,
        data,
        text,
        source,
        InventoryError,
        kind="inventory",
        path=source,
        written=written,
        unknown=_unknown_field,
    )


def load_inventory(path: str | Path) -> Inventory:
    """The inventory at `path`; an InventoryError says every problem (`unreadable` when
    the file could not be read at all)."""
    path = Path(path)
    return parse_inventory(read_text(path, str(path), InventoryError), str(path))
