"""Follows log files incrementally, across rotation, truncation and restarts.

Every configured file is read from where the last read stopped; each new byte range is
handed to a reader (the signature scanner) exactly once. The position of every file
(device, inode, offset, a digest of its first bytes) and the reader's tallies live in a
small state file, written atomically after each poll, so neither rotation nor a restart
loses a line or counts one twice:

- rename rotation (`x.log` -> `x.log.1`): the old file is read to its end through the
  descriptor kept open, and stays watched a little longer because a launchd job keeps
  writing to the renamed file until it respawns;
- copy-truncate: the copy beside the log (same first bytes) supplies the lines written
  between the last read and the truncation;
- a deleted file is finished through the open descriptor; a file that comes back is read
  from its start;
- after a restart, the saved inode is looked up next to the log.

A poll reads at most a budget of bytes, so a first look at a huge log catches up over a
few polls instead of overrunning a scrape's timeout.

One module at about 430 lines: every case above moves the same saved position, and
apart they would each have to re-read how the others left it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from mlx_medic import digests
from mlx_medic.state.files import StateFileError, read_text_nofollow, write_text_atomic

log = logging.getLogger("mlx_medic.exporter.logs")

HEAD_BYTES = 4096  # identifies a file's content across truncation and copies
MAX_DRAINING = 2  # rotated files still watched per log
STATE_VERSION = 1


class LogHandle(Protocol):
    """An open log file; positional reads only, so nothing depends on a file cursor."""

    def stat(self) -> os.stat_result: ...

    def pread(self, size: int, offset: int) -> bytes: ...

    def close(self) -> None: ...


class FileHandle:
    def __init__(self, path: str):
        # O_NONBLOCK: a FIFO at a log's path must not hang the scrape. O_NOFOLLOW: the
        # service's user owns the log's dir, so a link there must not make root read a
        # file that user may not (its size and signature counts would show on /metrics).
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK | os.O_NOFOLLOW
        self.fd = os.open(path, flags)
        try:
            mode = os.fstat(self.fd).st_mode
            if not stat.S_ISREG(mode):
                raise IsADirectoryError(f"{path} is not a regular file")
        except BaseException:
            os.close(self.fd)
            raise

    def stat(self) -> os.stat_result:
        return os.fstat(self.fd)

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


Opener = Callable[[str], LogHandle]


@dataclass
class FilePosition:
    """Where reading stopped in one file; `offset` is always a line start."""

    dev: int
    ino: int
    offset: int = 0
    skipping: bool = False  # inside an over-long line: ignore bytes up to its newline
    head_len: int = 0
    head_digest: str = ""

    def is_file(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino) == (self.dev, self.ino)


class RangeReader(Protocol):
    """What the follower hands new bytes to (the signature scanner)."""

    def consume(
        self,
        handle: LogHandle,
        pos: FilePosition,
        end: int,
        final: bool,
        counts: dict[str, int],
        budget: int | None = None,
    ) -> tuple[int, bool]:
        """Read `[pos.offset, end)` (at most about `budget` bytes), tally into `counts`,
        advance `pos`; return the bytes read and whether `end` was reached."""
        ...


def _digest(data: bytes) -> str:
    return digests.blake2b(data, digest_size=16).hexdigest()


@dataclass
class TrackedFile:
    position: FilePosition
    handle: LogHandle | None = None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


@dataclass
class LogState:
    path: str
    counts: dict[str, int]
    current: TrackedFile | None = None
    draining: list[TrackedFile] = field(default_factory=list)
    readable: bool = False
    unread: int = 0  # bytes of the current file not read yet (the poll's budget ran out)
    problem: str | None = None  # the last one logged, so each is logged once


class LogFollower:
    """The configured logs, each followed by path; tallies kept per log and tally name."""

    def __init__(
        self,
        files: Iterable[str | Path],
        tally_names: Iterable[str],
        reader: RangeReader,
        state_path: Path | None,
        opener: Opener = FileHandle,
    ):
        self.tally_names = tuple(tally_names)
        self.reader = reader
        self.state_path = state_path
        self.opener = opener
        self.bytes_read = 0
        self._budget_left: int | None = None
        self._saved = ""
        self._save_problem: str | None = None
        paths = sorted({os.path.abspath(str(f)) for f in files})
        self.logs = {p: LogState(p, self._zero()) for p in paths}
        self._load_state()

    def _zero(self) -> dict[str, int]:
        return dict.fromkeys(self.tally_names, 0)

    # -- state file --

    def _load_state(self) -> None:
        if self.state_path is None:
            return
        try:  # never through a link, a FIFO or a device planted in the state dir
            text = read_text_nofollow(self.state_path)
            if text is None:
                return
            raw = json.loads(text)
            files = raw["files"] if raw.get("version") == STATE_VERSION else {}
        except (StateFileError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning(
                "log positions in %s unusable (%s); reading logs from the start",
                self.state_path,
                exc,
            )
            return
        for path, saved in files.items():
            state = self.logs.get(path)
            if state is None or not isinstance(saved, dict):
                continue
            try:
                for name, value in saved.get("counts", {}).items():
                    if name in state.counts:
                        state.counts[name] = int(value)
                if saved.get("current"):
                    state.current = TrackedFile(FilePosition(**saved["current"]))
                state.draining = [TrackedFile(FilePosition(**d)) for d in saved.get("draining", [])]
            except (TypeError, ValueError) as exc:
                log.warning(
                    "saved position for %s unusable (%s); reading it from the start", path, exc
                )
                state.counts = self._zero()
                state.current, state.draining = None, []
        self._saved = self._state_json()

    def _state_json(self) -> str:
        files = {
            path: {
                "counts": state.counts,
                "current": asdict(state.current.position) if state.current else None,
                "draining": [asdict(d.position) for d in state.draining],
            }
            for path, state in self.logs.items()
        }
        return json.dumps({"version": STATE_VERSION, "files": files}, sort_keys=True)

    def _save_state(self) -> None:
        if self.state_path is None or not self.logs:
            return
        text = self._state_json()
        if text == self._saved:
            return
        try:  # the state dir's layout: 0640, the node's login user's like the rest
            write_text_atomic(self.state_path, text)
        except StateFileError as exc:
            problem = f"cannot save log positions to {self.state_path}: {exc}"
            if problem != self._save_problem:
                log.error("%s; a restart will re-read the logs from the saved point", problem)
            self._save_problem = problem
            return
        self._saved, self._save_problem = text, None

    # -- reading --

    def _note(self, state: LogState, problem: str | None) -> None:
        if problem and problem != state.problem:
            log.warning("log %s: %s", state.path, problem)
        elif problem is None and state.problem is not None:
            log.info("log %s: readable again", state.path)
        state.problem = problem
        state.readable = problem is None

    def _read(
        self, state: LogState, tracked: TrackedFile, end: int, final: bool, limited: bool = True
    ) -> bool:
        """Read the file up to `end` within this poll's budget; True if it got there."""
        assert tracked.handle is not None
        budget = self._budget_left if limited else None
        spent, finished = self.reader.consume(
            tracked.handle, tracked.position, end, final, state.counts, budget
        )
        self.bytes_read += spent
        if self._budget_left is not None:
            self._budget_left = max(0, self._budget_left - spent)
        return finished

    def _siblings(self, path: str) -> Iterator[str]:
        """The log itself and files named like its rotations, in its directory."""
        directory, base = os.path.split(path)
        try:
            names = os.listdir(directory)
        except OSError:
            return
        for name in sorted(names):
            if name.startswith(base):
                yield os.path.join(directory, name)

    def _open_by_inode(self, path: str, position: FilePosition) -> LogHandle | None:
        for candidate in self._siblings(path):
            try:
                if not position.is_file(os.lstat(candidate)):
                    continue
                handle = self.opener(candidate)
            except OSError:
                continue
            if position.is_file(handle.stat()):
                return handle
            handle.close()
        return None

    def _retire(self, state: LogState, tracked: TrackedFile) -> None:
        """The path no longer names this file: finish it, keep it if writers may still append."""
        if tracked.handle is None:
            tracked.handle = self._open_by_inode(state.path, tracked.position)
            if tracked.handle is None:
                log.warning(
                    "log %s: the file read before (inode %d) is gone; lines written "
                    "to it after offset %d are not counted",
                    state.path,
                    tracked.position.ino,
                    tracked.position.offset,
                )
                return
        st = tracked.handle.stat()
        deleted = st.st_nlink == 0
        if self._read(state, tracked, st.st_size, final=deleted) and deleted:
            tracked.close()
            return
        state.draining.append(tracked)  # renamed (writers may append) or not yet read to its end
        while len(state.draining) > MAX_DRAINING:
            oldest = state.draining.pop(0)
            if oldest.handle is not None:
                end = oldest.handle.stat().st_size
                self._read(state, oldest, end, final=True, limited=False)
            oldest.close()

    def _drain(self, state: LogState) -> None:
        for tracked in list(state.draining):
            try:
                if tracked.handle is None:
                    tracked.handle = self._open_by_inode(state.path, tracked.position)
                    if tracked.handle is None:
                        state.draining.remove(tracked)
                        continue
                st = tracked.handle.stat()
                done = self._read(state, tracked, st.st_size, final=st.st_nlink == 0)
                finished = done and st.st_nlink == 0
            except OSError as exc:
                log.warning("log %s: rotated file unreadable (%s); dropping it", state.path, exc)
                finished = True
            if finished:
                tracked.close()
                state.draining.remove(tracked)

    def _recover_copy(self, state: LogState, position: FilePosition) -> None:
        """After copy-truncate, read what the copy holds beyond our offset."""
        if position.offset == 0:
            return
        for candidate in self._siblings(state.path):
            if candidate == state.path:
                continue
            try:
                st = os.lstat(candidate)
                if not stat.S_ISREG(st.st_mode) or position.is_file(st):
                    continue
                if st.st_size < position.offset or not position.head_len:
                    continue
                handle = self.opener(candidate)
            except OSError:
                continue
            try:
                head = handle.pread(position.head_len, 0)
                self.bytes_read += len(head)
                if _digest(head) != position.head_digest:
                    continue
                copy = TrackedFile(
                    FilePosition(st.st_dev, st.st_ino, position.offset, position.skipping), handle
                )
                self._read(state, copy, handle.stat().st_size, final=True, limited=False)
                return
            finally:
                handle.close()
        log.warning(
            "log %s was truncated and no copy was found beside it; lines written "
            "after offset %d and before the truncation are not counted",
            state.path,
            position.offset,
        )

    def _update(self, state: LogState) -> None:
        try:
            path_stat: os.stat_result | None = os.lstat(state.path)
        except FileNotFoundError:
            path_stat = None
        except OSError as exc:
            self._note(state, f"cannot stat: {exc.strerror or exc}")
            self._drain(state)
            return
        current = state.current
        if (
            current is not None
            and current.handle is None
            and path_stat is not None
            and current.position.is_file(path_stat)
        ):
            try:
                current.handle = self.opener(state.path)
            except OSError as exc:
                self._note(state, f"cannot open: {exc.strerror or exc}")
                return
        if current is not None and (path_stat is None or not current.position.is_file(path_stat)):
            self._retire(state, current)
            state.current = current = None
        self._drain(state)
        if path_stat is None:
            self._note(state, "missing")
            return
        if current is None:
            try:
                handle = self.opener(state.path)
            except OSError as exc:
                self._note(state, f"cannot open: {exc.strerror or exc}")
                return
            st = handle.stat()
            current = state.current = TrackedFile(FilePosition(st.st_dev, st.st_ino), handle)
        assert current.handle is not None
        st = current.handle.stat()
        position = current.position
        head = current.handle.pread(min(st.st_size, HEAD_BYTES), 0) if st.st_size else b""
        self.bytes_read += len(head)
        replaced = st.st_size < position.offset or (
            position.head_len > 0
            and (
                len(head) < position.head_len
                or _digest(head[: position.head_len]) != position.head_digest
            )
        )
        if replaced:
            self._recover_copy(state, position)
            position.offset, position.skipping = 0, False
        position.head_len, position.head_digest = len(head), _digest(head)
        self._read(state, current, st.st_size, final=False)
        state.unread = max(0, st.st_size - position.offset)
        self._note(state, None)

    def poll(self, budget: int | None) -> None:
        """Read what every log gained, at most about `budget` bytes (None: no limit), then
        save positions and tallies together."""
        self._budget_left = budget
        for state in self.logs.values():
            try:
                self._update(state)
            except OSError as exc:
                self._note(state, f"read failed: {exc.strerror or exc}")
        self._save_state()

    def close(self) -> None:
        for state in self.logs.values():
            for tracked in (state.current, *state.draining):
                if tracked is not None:
                    tracked.close()
