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
import secrets
import tempfile
import time
from pathlib import Path

from mlx_medic.process_model import ENV_MODEL, ENV_RUN_ID

__all__ = [
    "ENV_MODEL",
    "ENV_RUN_ID",
    "current_run_path",
    "new_run_id",
    "read_current_run",
    "record_current_run",
    "run_env",
]

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # inventory NAME_PATTERN


def _check_model(model: str) -> str:
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
    return f"{stamp}-{secrets.token_hex(4)}"


def current_run_path(state_dir: Path, model: str) -> Path:
    return Path(state_dir) / "runs" / f"{_check_model(model)}.current"


def read_current_run(state_dir: Path, model: str) -> str | None:
    """The model's current run on this node; None if none is recorded, it is
    unreadable, or `model` cannot name a run file (a discovered `--model` path)."""
    try:
        path = current_run_path(state_dir, model)
    except ValueError:
        return None
    try:
        if path.is_symlink():
            return None  # never follow a planted link out of the state dir
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _RUN_ID.match(text) else None


def record_current_run(state_dir: Path, model: str, run_id: str) -> Path:
    """Write the current run atomically (temp file + rename), so a reader never
    sees half a run id."""
    check_run_id(run_id)
    path = current_run_path(state_dir, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(run_id + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def run_env(model: str, run_id: str) -> dict[str, str]:
    """The variables a launcher passes to every rank (`mlx.launch --env K=V`)."""
    return {ENV_RUN_ID: check_run_id(run_id), ENV_MODEL: _check_model(model)}
