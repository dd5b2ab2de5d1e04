"""The model lock's file on the head: its record (`LockInfo`) and the one action at a time
on it (`act_on_lock`, each a compare-then-write under an flock there).

Why apart from `model_lock`: `mlx-medic node lock` on the head needs only this, and a node
helper starts light (no inventory model, no pydantic); the remediator's and the serve
wrapper's side of the lock (who holds it, is its holder alive, waiting, renewing) is
`mlx_medic.model_lock`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlx_medic import digests
from mlx_medic.state.layout import locks_dir


def text_digest(text: str) -> str:
    """What `lock break` compares: the lock's text exactly as it was judged."""
    return digests.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class LockInfo:
    node: str | None  # the holder's inventory node; None: judged by its lease alone
    pid: int  # in the holder's node's PID namespace
    pid_start: float | None  # the holder's start (Unix time): a reused pid is not the holder
    host: str  # for people: where the holder said it runs; never used to judge
    time: float
    holder: str
    run_id: str
    expires: float
    token: str = ""  # the acquirer's nonce ("" in locks written before it existed)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> LockInfo:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the lock file is not a JSON object")
        return cls(
            node=None if data.get("node") is None else str(data["node"]),
            pid=int(data["pid"]),
            pid_start=None if data.get("pid_start") is None else float(data["pid_start"]),
            host=str(data["host"]),
            time=float(data["time"]),
            holder=str(data["holder"]),
            run_id=str(data["run_id"]),
            expires=float(data["expires"]),
            token=str(data.get("token", "")),
        )

    def describe(self) -> str:
        where = f"node {self.node}" if self.node else f"{self.host}, off the inventory's nodes"
        return (
            f"{self.holder} (run {self.run_id}, pid {self.pid} on {where},"
            f" since {time.strftime('%H:%M:%SZ', time.gmtime(self.time))})"
        )


def lock_path(state_dir: Path, model: str) -> Path:
    """Where the model's lock lives on its head node."""
    return locks_dir(state_dir) / f"{model}.lock"


@dataclass(frozen=True)
class LockState:
    """What one action on the lock left: whether it was done, and the lock's text after it
    (None: no lock). The `lock` helper's document carries it; its caller reads it here."""

    done: bool
    text: str | None

    def to_document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> LockState:
        """ValueError when the document is not a lock helper's answer."""
        done, text = document.get("done"), document.get("text")
        if not isinstance(done, bool) or not (text is None or isinstance(text, str)):
            raise ValueError(f"not a lock helper's answer (done {done!r}, text {text!r})")
        return cls(done, text)


# --- the lock file's actions (one compare-then-write under an flock each) ----------------


def checked_info(text: str) -> str:
    """The caller's lock JSON, checked to be a lock with a token, as one line (ValueError
    saying what is wrong)."""
    try:
        info = LockInfo.parse(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--info is not a lock ({exc})") from None
    if not info.token:
        raise ValueError("--info must carry the taker's token")
    return info.to_json()


def _token(text: str) -> str | None:
    """The token in a lock's text; None when there is none (an unreadable lock is nobody's)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    token = data.get("token") if isinstance(data, dict) else None
    return str(token) if token else None


def _create_exclusive(path: Path, text: str) -> bool:
    """Create `path` whole or not at all; False when it exists (a link too)."""
    from mlx_medic.state.files import StateFileError, write_text_atomic

    tmp = write_text_atomic(path.with_name(f".{path.name}.{os.getpid()}.new"), text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as exc:
        raise StateFileError(f"cannot create {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return True


def act_on_lock(
    path: Path,
    action: str,
    *,
    info: str | None = None,
    token: str | None = None,
    expected_token: str | None = None,
    expected_sha256: str | None = None,
) -> bool:
    """One action on the lock file (`mlx-medic node lock`'s, or the serve wrapper's on its
    own head) under the lock's flock; whether it happened."""
    from mlx_medic.node.record_lock import exclusive
    from mlx_medic.state.files import read_text_nofollow, remove_record, write_text_atomic

    if action == "show":
        return True
    with exclusive(path.with_name(f"{path.name}.guard")):
        current = read_text_nofollow(path)
        if action == "take":
            return _create_exclusive(path, checked_info(info or ""))
        if action == "replace":
            if current is None or _token(current) != expected_token:
                return False
            write_text_atomic(path, checked_info(info or ""))
            return True
        if current is None:
            return action == "release"  # nothing to release: done
        if (action == "release" and _token(current) == token) or (
            action == "break" and text_digest(current) == expected_sha256
        ):
            remove_record(path)
            return True
        return False


def act_and_read(path: Path, action: str, **options: str | None) -> LockState:
    """`act_on_lock`, and the lock's text as the action left it (so its caller judges
    what is really there)."""
    from mlx_medic.state.files import read_text_nofollow

    done = act_on_lock(path, action, **options)
    return LockState(done, read_text_nofollow(path))
