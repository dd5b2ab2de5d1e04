"""The model's durable backend choice, kept on its head: `auto` (JACCL, then ring), or
pinned to `ring` or `jaccl`.

The remediator pins ring after a JACCL failure; a person pins or unpins with
`mlx-medic backend MODEL ring|jaccl|auto`; the serve wrapper reads it before it starts.
It is a file of its own so the pin outlives every process (and is visible to the
exporter on the head). No record means `auto`.

A ring pin that mlx-medic set itself (`automatic`) is lifted by the serve wrapper once a
node of the model has rebooted since the pin (its boot id differs from the one in
`boots`, stamped at the first start under the pin): a reboot frees what the failure
held, so JACCL is tried again, with its smoke test. A person's pin is never lifted.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

from mlx_medic.state.files import StateFileError, read_json_record, write_json_record
from mlx_medic.state.runs import check_model

Choice = Literal["auto", "ring", "jaccl"]
CHOICES: tuple[Choice, ...] = get_args(Choice)
# Who chooses on mlx-medic's own: the remediator (`remediator run 12`, as its steps say
# who acts) and the serve wrapper. Anyone else is a person.
AUTOMATIC_CHOOSERS = ("remediator run ", "mlx-medic serve")


@dataclass(frozen=True)
class BackendChoice:
    choice: Choice
    by: str  # who chose: "remediator run 12", "root at a terminal"; "" for the default
    at: float  # when (0 for the default)
    reason: str
    # node -> boot id when an automatic pin was first started under (empty until then)
    boots: dict[str, str] = field(default_factory=dict)

    @property
    def pinned(self) -> bool:
        return self.choice != "auto"

    @property
    def automatic(self) -> bool:
        """Chosen by mlx-medic itself, not by a person."""
        return self.by.startswith(AUTOMATIC_CHOOSERS)

    def rebooted_since(self, boots: dict[str, str]) -> list[str]:
        """The nodes whose boot id differs from the one stamped with the pin."""
        return sorted(
            node for node, boot in boots.items() if node in self.boots and self.boots[node] != boot
        )

    def retry(self) -> str:
        """When JACCL will be tried again, in words."""
        if self.choice == "auto":
            return "JACCL is tried first at every start while the ledger allows it"
        if self.choice == "jaccl":
            return "pinned to JACCL: no ring fallback until it is unpinned"
        if not self.automatic:
            return (
                "JACCL is not tried again automatically (a person pinned ring):"
                " unpin with `mlx-medic backend MODEL auto`"
            )
        if not self.boots:
            return (
                "JACCL is tried again after a node of the model reboots (the boot ids"
                " are stamped at the next start)"
            )
        return (
            f"JACCL is tried again once one of {', '.join(sorted(self.boots))} has"
            " rebooted (mlx-medic lifts its own ring pin once per reboot)"
        )


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
        boots = data.get("boots") or {}
        return BackendChoice(
            parse_choice(str(data["choice"])),
            str(data.get("by", "")),
            float(data.get("at", 0.0)),
            str(data.get("reason", "")),
            {str(k): str(v) for k, v in dict(boots).items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateFileError(f"{path} is not a backend choice ({exc})") from None


def write_backend_choice(
    state_dir: Path,
    model: str,
    choice: str,
    *,
    by: str,
    reason: str,
    now: float | None = None,
    boots: dict[str, str] | None = None,
) -> BackendChoice:
    record = BackendChoice(
        parse_choice(choice), by, time.time() if now is None else now, reason, dict(boots or {})
    )
    write_json_record(backend_choice_path(state_dir, model), asdict(record))
    return record
