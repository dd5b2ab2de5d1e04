"""The model's durable backend choice, kept on its head: `auto` (JACCL, then ring), or
pinned to `ring` or `jaccl`.

The remediator pins ring after a JACCL failure; a person pins or unpins with
`mlx-medic backend MODEL ring|jaccl|auto`; the serve wrapper reads it before it starts.
It is a file of its own so the pin outlives every process (and is visible to the
exporter on the head). No record means `auto`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, get_args

from mlx_medic.runs import check_model
from mlx_medic.state_files import StateFileError, read_json_record, write_json_record

Choice = Literal["auto", "ring", "jaccl"]
CHOICES: tuple[Choice, ...] = get_args(Choice)


@dataclass(frozen=True)
class BackendChoice:
    choice: Choice
    by: str  # who chose: "remediator run 12", "root at a terminal"; "" for the default
    at: float  # when (0 for the default)
    reason: str

    @property
    def pinned(self) -> bool:
        return self.choice != "auto"


AUTO = BackendChoice("auto", "", 0.0, "no choice recorded: JACCL first, then ring")


def backend_choice_path(state_dir: Path, model: str) -> Path:
    return Path(state_dir) / "backend" / f"{check_model(model)}.json"


def parse_choice(value: str) -> Choice:
    if value not in CHOICES:
        raise ValueError(f"{value!r} is not a backend choice (one of {', '.join(CHOICES)})")
    return value  # type: ignore[return-value]


def read_backend_choice(state_dir: Path, model: str) -> BackendChoice:
    path = backend_choice_path(state_dir, model)
    data = read_json_record(path)
    if data is None:
        return AUTO
    try:
        return BackendChoice(parse_choice(str(data["choice"])), str(data.get("by", "")),
                             float(data.get("at", 0.0)), str(data.get("reason", "")))  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{path} is not a backend choice ({exc})") from None


def write_backend_choice(
    state_dir: Path, model: str, choice: str, *, by: str, reason: str,
    now: float | None = None,
) -> BackendChoice:  # fmt: skip
    record = BackendChoice(parse_choice(choice), by, time.time() if now is None else now, reason)
    write_json_record(backend_choice_path(state_dir, model), asdict(record))
    return record
