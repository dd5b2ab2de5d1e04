"""The record "this node is drained", kept on the node itself (`drain.json` in its state
dir): `mlx-medic drain NODE` writes it once the node's models are stopped and `mlx-medic
undrain NODE` removes it (`mlx-medic node drain set|clear`). The journal keeps the whole
drain (remediator/drain.py); this small record lets what reads the node (`node facts`'
`drain`, and so doctor or the exporter) see it there: who drained it, since when, which
models. A reboot keeps it: the undrain after the reboot removes it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mlx_medic.state.files import (
    StateFileError,
    read_json_record,
    remove_record,
    write_json_record,
)
from mlx_medic.state.runs import check_model

DRAIN_FILE = "drain.json"


@dataclass(frozen=True)
class NodeDrain:
    by: str  # who drained it, as the journal says it (`alice@host`)
    since: float
    models: tuple[str, ...]


def node_drain_path(state_dir: Path) -> Path:
    return Path(state_dir) / DRAIN_FILE


def record_node_drain(
    state_dir: Path, by: str, models: tuple[str, ...], now: float | None = None
) -> NodeDrain:
    if not by:
        raise ValueError("a drain must name who drains the node")
    record = NodeDrain(by, time.time() if now is None else now, tuple(map(check_model, models)))
    write_json_record(node_drain_path(state_dir), {**asdict(record), "models": list(models)})
    return record


def read_node_drain(state_dir: Path) -> NodeDrain | None:
    path = node_drain_path(state_dir)
    data = read_json_record(path)
    if data is None:
        return None
    try:
        return NodeDrain(
            str(data["by"]), float(data["since"]), tuple(str(m) for m in data["models"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{path} is not a drain record ({exc})") from None


def clear_node_drain(state_dir: Path) -> bool:
    """Remove the record at the undrain; False when there was none."""
    return remove_record(node_drain_path(state_dir))
