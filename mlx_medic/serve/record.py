"""The head's serve record: which wrapper serves the model, in which state, on which
backend, and what went wrong last.

Kept in `<state_dir>/serve/<model>.json` on the head, written whole by the wrapper at
every change of state. A second `serve` reads it to refuse while a live wrapper is
recorded; the exporter's `serve` collector serves it (backend in use, state, failed
starts); the next start reads the last JACCL success to decide whether the smoke test
can be skipped.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from mlx_medic.state.files import StateFileError, read_json_record, write_json_record
from mlx_medic.state.runs import check_model

ServeState = Literal["starting", "serving", "failed", "stopped"]
SERVE_STATES: tuple[ServeState, ...] = get_args(ServeState)
LIVE_STATES = ("starting", "serving")
START_TOLERANCE = 2.0  # seconds: a recorded start this close to the pid's is the same process


@dataclass(frozen=True)
class Failure:
    """Why a start failed: which backend, on which host, why, and the line that said so."""

    backend: str
    host: str
    reason: str
    line: str = ""

    def describe(self) -> str:
        said = f" ({self.line})" if self.line and self.line != self.reason else ""
        return f"{self.backend} failed on {self.host}: {self.reason}{said}"


@dataclass(frozen=True)
class BackendSuccess:
    """A backend's last start that came up, with each node's boot id then."""

    boot_ids: dict[str, str]
    at: float


JacclSuccess = BackendSuccess  # its first name, kept for the callers that use it


@dataclass(frozen=True)
class ServeRecord:
    run_id: str
    pid: int
    pid_start: float | None
    state: ServeState
    backend: str | None = None  # the backend the run serves (or tries to start) on
    failures: tuple[Failure, ...] = ()  # of the last start that failed (each backend tried)
    failed_starts: int = 0  # starts that failed, over the record's life
    last_jaccl_success: BackendSuccess | None = None
    jaccl_error_at: float | None = None  # a JACCL error seen in a run's output
    last_ring_success: BackendSuccess | None = None
    ring_error_at: float | None = None  # a ring start that failed
    # nodes whose reboot the last start needs: a survivor there holds the model's port
    reboot: tuple[str, ...] = ()
    backend_reason: str = ""  # why the run serves (or tries) on its backend, in words
    argv: tuple[str, ...] = ()  # the mlx.launch command line the run started
    updated: float = field(default_factory=time.time)

    def last_success(self, backend: str) -> BackendSuccess | None:
        return {"jaccl": self.last_jaccl_success, "ring": self.last_ring_success}.get(backend)

    def error_at(self, backend: str) -> float | None:
        return {"jaccl": self.jaccl_error_at, "ring": self.ring_error_at}.get(backend)

    def with_state(self, state: ServeState, **changes: Any) -> ServeRecord:
        return replace(self, state=state, updated=time.time(), **changes)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["failures"] = [asdict(f) for f in self.failures]
        data["reboot"] = list(self.reboot)
        data["argv"] = list(self.argv)
        return data


def serve_record_path(state_dir: Path, model: str) -> Path:
    return Path(state_dir) / "serve" / f"{check_model(model)}.json"


def write_serve_record(state_dir: Path, model: str, record: ServeRecord) -> ServeRecord:
    write_json_record(serve_record_path(state_dir, model), record.to_json())
    return record


def read_serve_record(state_dir: Path, model: str) -> ServeRecord | None:
    """The record; None when the model was never served here. StateFileError when it
    cannot be read."""
    path = serve_record_path(state_dir, model)
    data = read_json_record(path)
    if data is None:
        return None
    try:
        state = str(data["state"])
        if state not in SERVE_STATES:
            raise ValueError(f"state {state!r}")
        success = data.get("last_jaccl_success")
        ring_success = data.get("last_ring_success")
        return ServeRecord(
            run_id=str(data["run_id"]),
            pid=int(data["pid"]),
            pid_start=None if data.get("pid_start") is None else float(data["pid_start"]),
            state=state,  # type: ignore[arg-type]
            backend=None if data.get("backend") is None else str(data["backend"]),
            failures=tuple(
                Failure(str(f["backend"]), str(f["host"]), str(f["reason"]), str(f.get("line", "")))
                for f in data.get("failures", [])
            ),
            failed_starts=int(data.get("failed_starts", 0)),
            last_jaccl_success=_success(success),
            jaccl_error_at=(
                None if data.get("jaccl_error_at") is None else float(data["jaccl_error_at"])
            ),
            last_ring_success=_success(ring_success),
            ring_error_at=(
                None if data.get("ring_error_at") is None else float(data["ring_error_at"])
            ),
            reboot=tuple(str(node) for node in data.get("reboot", ())),
            backend_reason=str(data.get("backend_reason", "")),
            argv=tuple(str(word) for word in data.get("argv", ())),
            updated=float(data.get("updated", 0.0)),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateFileError(f"{path} is not a serve record ({exc})") from None


def _success(data: Any) -> BackendSuccess | None:
    if not data:
        return None
    return BackendSuccess({str(k): str(v) for k, v in data["boot_ids"].items()}, float(data["at"]))


def wrapper_alive(record: ServeRecord) -> bool:
    """Whether the recorded wrapper still runs on this node (the head): its pid lives and
    started when the record says (a reused pid is another process)."""
    from mlx_medic.serve.guard import start_time

    if record.state not in LIVE_STATES:
        return False
    started = start_time(record.pid)
    if started is None:
        return False
    return record.pid_start is None or abs(started - record.pid_start) <= START_TOLERANCE


class RecordKeeper:
    """The wrapper's own record, saved at every change."""

    def __init__(self, state_dir: Path, model: str, record: ServeRecord):
        self.state_dir, self.model, self.record = Path(state_dir), model, record
        write_serve_record(self.state_dir, model, record)

    def update(self, state: ServeState | None = None, **changes: Any) -> ServeRecord:
        self.record = self.record.with_state(state or self.record.state, **changes)
        return write_serve_record(self.state_dir, self.model, self.record)
