"""Small records in a node's state dir: written whole or not at all, read without
following a planted link.

Every record a node keeps about a model (current run, run lease, backend choice, the
service stopped by a run, the PD ledger) goes through these two functions, so a reader
never sees half a file and a symlink never leads a write or a read out of the state dir.
A record is FILE_MODE (0640) and belongs to the owner of its dir, whoever writes it
(mlx_medic.state.layout: root's writes stay the node's login user's).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from mlx_medic.state.layout import FILE_MODE, Owner, StateFileError, ensure_dir, settle_new_file

__all__ = [
    "MAX_RECORD_BYTES",
    "StateFileError",
    "read_json_record",
    "read_text_nofollow",
    "remove_record",
    "write_json_record",
    "write_text_atomic",
]

MAX_RECORD_BYTES = 1 << 20


def write_text_atomic(
    path: Path, text: str, mode: int = FILE_MODE, owner: Owner | None = None
) -> Path:
    """Write `text` to `path` through a temp file in the same dir, fsync, rename. The file
    is `mode`, owned by `owner` (default: the owner of its dir, so a record root writes
    stays the login user's); missing dirs are made as the state dir's layout says."""
    path = Path(path)
    ensure_dir(path.parent, owner)
    try:
        import tempfile  # here: a node helper that only reads records never needs it

        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise StateFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            settle_new_file(handle.fileno(), path, owner, mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise StateFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_text_nofollow(path: Path) -> str | None:
    """The file's text; None when it does not exist. A symlink, a non-file, an oversized
    or undecodable file is a StateFileError, never followed."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        reason = "it is a symlink" if path.is_symlink() else (exc.strerror or str(exc))
        raise StateFileError(f"cannot read {path}: {reason}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise StateFileError(f"cannot read {path}: not a regular file")
        data = handle.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise StateFileError(f"cannot read {path}: larger than {MAX_RECORD_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StateFileError(f"cannot read {path}: not UTF-8 text") from None


def read_json_record(path: Path) -> dict[str, Any] | None:
    """A JSON object record; None when absent; StateFileError when it is not one."""
    text = read_text_nofollow(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateFileError(f"{path} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StateFileError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def write_json_record(path: Path, data: dict[str, Any]) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def remove_record(path: Path) -> bool:
    """Remove a record (never what a symlink points at); False when there was none."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StateFileError(f"cannot remove {path}: {exc.strerror or exc}") from None
    return True
