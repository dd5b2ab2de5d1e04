"""Which of mlx-medic's two config files a YAML mapping is, told by its top-level keys.

The inventory (the cluster: `nodes:`, `models:`) and the remediator's own config
(`inventory:`, `journal:`, `routing:`, ...) share no top-level key, so a file given where
the other is expected is named as such, by both loaders and by `check-config`, instead of
a list of unknown fields. Nothing here imports pydantic or PyYAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["inventory", "remediator"]

# The top-level fields of each (tests/test_check_config.py holds them to the models).
INVENTORY_KEYS = ("nodes", "models", "ssh", "signatures", "state_dir", "launch_temp_dirs")
# The remediator's `node` is left out: it is one letter from the inventory's `nodes`, so
# an inventory with that typo is not taken for the remediator's config.
REMEDIATOR_KEYS = (
    "inventory",
    "journal",
    "listen",
    "auth",
    "insecure_no_auth",
    "tls",
    "routing",
    "dry_run",
    "max_body_bytes",
    "alerts_per_delivery",
    "alerts_per_second",
    "max_alert_age",
    "journal_retention",
    "lock_wait",
    "lock_lease",
    "max_parallel_runs",
    "orphans_clean_window",
    "notify_url",
    "probe_from",
)

# What an empty file and another top level are told, per kind (None: not known yet).
EMPTY_FILE: dict[Kind | None, str] = {
    "inventory": "the file is empty; it needs at least `nodes:`",
    "remediator": "the file is empty; `{}` is a config of the embedded defaults",
    None: "the file is empty",
}
TOP_LEVEL: dict[Kind | None, str] = {
    "inventory": "the top level must be a mapping with `nodes:` and `models:`",
    "remediator": "the top level must be a mapping of settings (`inventory:`, `journal:`, ...)",
    None: "the top level must be a mapping",
}


@dataclass(frozen=True)
class Detected:
    kind: Kind
    keys: tuple[str, ...]  # the file's top-level keys that told it, in file order


def keys_of_each(mapping: Mapping[Any, Any]) -> dict[Kind, tuple[str, ...]]:
    """The mapping's top-level keys that only each kind has, in file order."""
    return {
        "inventory": tuple(k for k in mapping if k in INVENTORY_KEYS),
        "remediator": tuple(k for k in mapping if k in REMEDIATOR_KEYS),
    }


def detect_kind(mapping: Mapping[Any, Any]) -> Detected | None:
    """The kind whose keys the mapping has, if it has none of the other's; else None."""
    found = [Detected(kind, keys) for kind, keys in keys_of_each(mapping).items() if keys]
    return found[0] if len(found) == 1 else None


def mixup(mapping: Mapping[Any, Any], expected: Kind, path: str) -> str | None:
    """What to say after the file's name (`path`) when it is plainly the other kind."""
    found = detect_kind(mapping)
    if found is None or found.kind == expected:
        return None
    keys = ", ".join(found.keys)
    if found.kind == "remediator":
        named = mapping.get("inventory")
        where = f" ({named})" if isinstance(named, str) else ""
        return (
            f"looks like the remediator's config (it has {keys}), not an inventory;"
            f" the inventory is the file its `inventory:` names{where}"
        )
    return (
        f"looks like an inventory (it has {keys}), not the remediator's config;"
        f" the remediator's config names it with `inventory: {path}`"
    )
