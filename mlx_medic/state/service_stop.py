"""The record "run X stopped the model's service", kept on the head.

Written before the service is stopped and removed once it is started again, so a service
left stopped (the remediator crashed between its stop and its start, or gave up) is seen
by any remediator after a restart, by a replica, by `mlx-medic log` and by the exporter.
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


@dataclass(frozen=True)
class ServiceStop:
    run: str  # the remediation run (or person) that stopped it, e.g. "remediator run 12"
    at: float
    reason: str


def service_stop_path(state_dir: Path, model: str) -> Path:
    return Path(state_dir) / "service" / f"{check_model(model)}.stopped"


def record_service_stop(
    state_dir: Path, model: str, run: str, reason: str, now: float | None = None
) -> ServiceStop:
    if not run:
        raise ValueError("a service stop must name the run that stops the service")
    record = ServiceStop(run, time.time() if now is None else now, reason)
    write_json_record(service_stop_path(state_dir, model), asdict(record))
    return record


def read_service_stop(state_dir: Path, model: str) -> ServiceStop | None:
    path = service_stop_path(state_dir, model)
    data = read_json_record(path)
    if data is None:
        return None
    try:
        return ServiceStop(str(data["run"]), float(data["at"]), str(data.get("reason", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{path} is not a service-stop record ({exc})") from None


def clear_service_stop(state_dir: Path, model: str) -> bool:
    """Remove the record once the service runs again; False when there was none."""
    return remove_record(service_stop_path(state_dir, model))
