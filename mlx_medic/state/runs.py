"""The run-id convention shared by the serve wrapper, the exporter and the remediator.

The serve wrapper starts every rank with `MLX_MEDIC_RUN_ID` and
`MLX_MEDIC_MODEL` in its environment and records the current run of a model
on each node in `<state_dir>/runs/<model>.current`. A scoped process whose
run id is not the current one is left over from an earlier run, whoever its
parent is: the strongest orphan signal, and one a node can judge alone.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from mlx_medic.inventory.names import NAME_PATTERN
from mlx_medic.processes.info import ENV_MODEL, ENV_RUN_ID
from mlx_medic.state.files import (
    StateFileError,
    read_json_record,
    read_text_nofollow,
    write_json_record,
    write_text_atomic,
)

__all__ = [
    "ENV_MODEL",
    "ENV_RUN_ID",
    "RunLease",
    "current_run_path",
    "lease_path",
    "new_run_id",
    "read_current_run",
    "read_lease",
    "record_current_run",
    "record_lease",
    "run_env",
]

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_MODEL = re.compile(NAME_PATTERN)


def check_model(model: str) -> str:
    if not _MODEL.match(model):
        raise ValueError(f"model name {model!r} is not a valid inventory model name")
    return model


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(
            f"run id {run_id!r} must be 1-128 characters of letters, digits, '.', '_', ':', '-'"
        )
    return run_id


def new_run_id(now: float | None = None) -> str:
    """Sortable by start time and unique: `20261130T021500Z-1a2b3c4d`."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{os.urandom(4).hex()}"


def current_run_path(state_dir: Path, model: str) -> Path:
    return Path(state_dir) / "runs" / f"{check_model(model)}.current"


def read_current_run(state_dir: Path, model: str) -> str | None:
    """The model's current run on this node; None if none is recorded, it is
    unreadable, or `model` cannot name a run file (a discovered `--model` path)."""
    try:
        path = current_run_path(state_dir, model)
    except ValueError:
        return None
    try:
        text = read_text_nofollow(path)  # never follows a planted link out of the state dir
    except StateFileError:
        return None
    if text is None:
        return None
    text = text.strip()
    return text if _RUN_ID.match(text) else None


def record_current_run(state_dir: Path, model: str, run_id: str) -> Path:
    """Write the current run atomically (temp file + rename), so a reader never
    sees half a run id."""
    check_run_id(run_id)
    return write_text_atomic(current_run_path(state_dir, model), run_id + "\n")


@dataclass(frozen=True)
class RunLease:
    """A run's lease on a node: its ranks there may live until `expires_at` (wall clock).

    The serve wrapper renews it on every node of its run; a guard beside each rank ends
    the rank once the lease runs out (the wrapper was SIGKILLed) or the node's current run
    is another one (a newer start)."""

    run_id: str
    expires_at: float
    holder: str  # who renews it, e.g. "serve pid 4242 on ai001"

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def lease_path(state_dir: Path, model: str) -> Path:
    return Path(state_dir) / "runs" / f"{check_model(model)}.lease"


def record_lease(
    state_dir: Path,
    model: str,
    run_id: str,
    seconds: float,
    holder: str,
    now: float | None = None,
) -> RunLease:
    """Grant or renew the run's lease for `seconds` from now."""
    if seconds <= 0:
        raise ValueError(f"a lease of {seconds:g}s has already run out")
    lease = RunLease(check_run_id(run_id), (time.time() if now is None else now) + seconds, holder)
    write_json_record(
        lease_path(state_dir, model),
        {"run_id": lease.run_id, "expires_at": lease.expires_at, "holder": lease.holder},
    )
    return lease


def read_lease(state_dir: Path, model: str) -> RunLease | None:
    """The model's run lease on this node; None when none is recorded. An unreadable
    lease is a StateFileError: a guard treats it as run out."""
    data = read_json_record(lease_path(state_dir, model))
    if data is None:
        return None
    try:
        return RunLease(
            check_run_id(str(data["run_id"])),
            float(data["expires_at"]),
            str(data.get("holder", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{lease_path(state_dir, model)} is not a run lease ({exc})") from None


def run_env(model: str, run_id: str) -> dict[str, str]:
    """The variables a launcher passes to every rank (`mlx.launch --env K=V`)."""
    return {ENV_RUN_ID: check_run_id(run_id), ENV_MODEL: check_model(model)}
