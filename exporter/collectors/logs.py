"""Counts error signatures in the model services' logs: `mlx_log_errors_total`.

The only early sign of protection-domain exhaustion was a log line, so every
configured log is read incrementally: each scrape reads just the bytes added
since the last one. The position of every file (device, inode, offset, a digest
of its first bytes) and the counts live in a small state file, written
atomically after each scrape, so neither rotation nor an exporter restart loses
a line or counts one twice:

- rename rotation (`x.log` -> `x.log.1`): the old file is read to its end
  through the descriptor kept open, and stays watched a little longer because a
  launchd job keeps writing to the renamed file until it respawns;
- copy-truncate: the copy beside the log (same first bytes) supplies the lines
  written between the last read and the truncation;
- a deleted file is finished through the open descriptor; a file that comes
  back is read from its start;
- after a restart, the saved inode is looked up next to the log.

Reading is chunked over bytes: a prefilter finds the signatures' literal
anchors (Hyperscan when installed, else `bytes.find` per anchor) and only the
lines containing one are decoded and matched. Lines are split on `\\n`; only
the first `MAX_LINE_BYTES` of a line are examined; a partial last line waits for
its newline. A scrape reads at most `MAX_READ_PER_SCRAPE` bytes, so a first
look at a huge log catches up over a few scrapes instead of overrunning the
scrape timeout. Logs are the head node's (the launchd service and mlx.launch
run there), so a peer exports no log series for the model.

    mlx_log_errors_total{signature="jaccl_protection_domain",file="/var/log/glm.err.log"} 3.0
    mlx_log_file_readable{file="/var/log/glm.err.log"} 1.0
    mlx_log_unread_bytes{file="/var/log/glm.err.log"} 0.0
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.signatures import LogSignature, merged_anchors, signatures_for

log = logging.getLogger("mlx_medic.exporter.logs")

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 64 * 1024
HEAD_BYTES = 4096  # identifies a file's content across truncation and copies
MAX_DRAINING = 2  # rotated files still watched per log
MAX_READ_PER_SCRAPE = 512 << 20  # a huge first read is spread over scrapes, within their timeout
STATE_FILE = "logs-positions.json"
STATE_VERSION = 1


# --- reading files ---------------------------------------------------------------


class LogHandle(Protocol):
    """An open log file; positional reads only, so nothing depends on a file cursor."""

    def stat(self) -> os.stat_result: ...

    def pread(self, size: int, offset: int) -> bytes: ...

    def close(self) -> None: ...


class FileHandle:
    def __init__(self, path: str):
        # O_NONBLOCK: a FIFO configured as a log must not hang the scrape.
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
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


# --- finding candidate lines -------------------------------------------------------


class Prefilter(Protocol):
    def hits(self, buf: bytes, lo: int, hi: int) -> Iterable[int]:
        """Offsets in `buf[lo:hi]` inside an anchor occurrence (any order)."""
        ...


class FindPrefilter:
    """One `bytes.find` pass per anchor; anchors sharing text are merged first."""

    name = "find"

    def __init__(self, anchors: Sequence[bytes]):
        self.anchors = merged_anchors(anchors)

    def hits(self, buf: bytes, lo: int, hi: int) -> Iterator[int]:
        for anchor in self.anchors:
            i = buf.find(anchor, lo, hi)
            while i != -1:
                yield i
                end = buf.find(b"\n", i, hi)  # one hit per line is enough
                if end == -1:
                    break
                i = buf.find(anchor, end + 1, hi)


class HyperscanPrefilter:
    """All anchors in one pass with Hyperscan/Vectorscan (SIMD literal matching)."""

    name = "hyperscan"

    def __init__(self, anchors: Sequence[bytes]):
        import hyperscan  # a dependency where wheels exist (pyproject.toml)

        self.anchors = sorted(set(anchors))
        expressions = [b"".join(b"\\x%02x" % c for c in a) for a in self.anchors]
        self.db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self.db.compile(
            expressions=expressions,
            ids=list(range(len(expressions))),
            elements=len(expressions),
            flags=[0] * len(expressions),
        )

    def hits(self, buf: bytes, lo: int, hi: int) -> list[int]:
        found: list[int] = []

        def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            found.append(lo + end - 1)

        view: bytes = memoryview(buf)[lo:hi]  # type: ignore[assignment]  # zero-copy
        self.db.scan(view, match_event_handler=on_match)
        return found


def make_prefilter(anchors: Sequence[bytes], engine: str = "auto") -> Prefilter:
    if engine not in ("auto", "hyperscan", "find"):
        raise ValueError(f"unknown prefilter engine {engine!r}; use auto, hyperscan or find")
    if engine != "find":
        try:
            return HyperscanPrefilter(anchors)
        except ImportError:
            if engine == "hyperscan":
                raise
    return FindPrefilter(anchors)


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


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class LineScanner:
    """Counts signature matches in byte ranges: each line at most once per signature."""

    def __init__(
        self,
        signatures: Sequence[LogSignature],
        engine: str = "auto",
        max_line: int = MAX_LINE_BYTES,
        chunk: int = CHUNK_BYTES,
    ):
        self.max_line = max_line
        self.chunk = chunk
        self.anchored = [s for s in signatures if s.anchors and b"\n" not in b"".join(s.anchors)]
        self.unanchored = [s for s in signatures if s not in self.anchored]
        anchors = [a for s in self.anchored for a in s.anchors]
        self.prefilter: Prefilter | None = make_prefilter(anchors, engine) if anchors else None

    def consume(
        self,
        handle: LogHandle,
        pos: FilePosition,
        end: int,
        final: bool,
        counts: dict[str, int],
        budget: int | None = None,
    ) -> tuple[int, bool]:
        """Read `[pos.offset, end)`, count complete lines, advance `pos`.

        Returns the bytes read and whether `end` was reached (reading stops
        early, at a chunk boundary, once `budget` bytes are read). A trailing
        partial line is left for the next call unless `final` (the file will
        not grow any more) and `end` was reached: then it counts as a line.
        """
        read_pos = pos.offset
        carry = b""  # an incomplete line starting at pos.offset
        total = 0
        while read_pos < end and (budget is None or total < budget):
            data = handle.pread(min(self.chunk, end - read_pos), read_pos)
            if not data:
                read_pos = end  # the file shrank under us; the next scrape sees the truncation
                break
            total += len(data)
            base = read_pos
            read_pos += len(data)
            lo = 0
            if pos.skipping:
                newline = data.find(b"\n")
                if newline == -1:
                    pos.offset = read_pos
                    continue
                lo = newline + 1
                pos.offset = base + lo
                pos.skipping = False
            first = data.find(b"\n", lo)
            if first == -1:
                carry += data[lo:]
                if len(carry) > self.max_line:
                    self.count_line(carry[: self.max_line], counts)
                    carry = b""
                    pos.offset, pos.skipping = read_pos, True
                continue
            if carry:
                self.count_line((carry + data[lo:first])[: self.max_line], counts)
                carry = b""
                lo = first + 1
            last = data.rfind(b"\n")
            if last + 1 > lo:
                self.count_region(data, lo, last + 1, counts)
            pos.offset = base + last + 1
            rest = data[last + 1 :]
            if len(rest) > self.max_line:
                self.count_line(rest[: self.max_line], counts)
                pos.offset, pos.skipping = read_pos, True
            else:
                carry = rest
        finished = read_pos >= end
        if final and finished:
            if carry:
                self.count_line(carry[: self.max_line], counts)
            pos.offset, pos.skipping = max(read_pos, pos.offset), False
        return total, finished

    def count_line(self, line: bytes, counts: dict[str, int]) -> None:
        text = line.decode("utf-8", "replace")
        for signature in (*self.anchored, *self.unanchored):
            if signature.regex.search(text):
                counts[signature.name] += 1

    def count_region(self, buf: bytes, lo: int, hi: int, counts: dict[str, int]) -> None:
        """Count the complete lines of `buf[lo:hi]` (which ends with a newline)."""
        if self.prefilter is not None and self.anchored:
            starts: set[int] = set()
            for hit in self.prefilter.hits(buf, lo, hi):
                newline = buf.rfind(b"\n", lo, hit)
                starts.add(newline + 1 if newline >= 0 else lo)
            for start in starts:
                stop = buf.find(b"\n", start, hi)
                stop = hi if stop == -1 else stop
                text = buf[start : min(stop, start + self.max_line)].decode("utf-8", "replace")
                for signature in self.anchored:
                    if signature.regex.search(text):
                        counts[signature.name] += 1
        if self.unanchored:
            self._count_unanchored(buf[lo:hi].decode("utf-8", "replace"), counts)

    def _count_unanchored(self, text: str, counts: dict[str, int]) -> None:
        # The slow path, for inventory patterns without a literal: one regex pass
        # over the text, then the match is confirmed on its own line.
        for signature in self.unanchored:
            seen: set[int] = set()
            for match in signature.regex.finditer(text):
                start = text.rfind("\n", 0, match.start()) + 1
                if start in seen:
                    continue
                seen.add(start)
                stop = text.find("\n", start)
                line = text[start : len(text) if stop == -1 else stop][: self.max_line]
                if signature.regex.search(line):
                    counts[signature.name] += 1


# --- one configured log --------------------------------------------------------------


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
    unread: int = 0  # bytes of the current file not read yet (the per-scrape budget ran out)
    problem: str | None = None  # the last one logged, so each is logged once


class LogsCollector(Collector):
    """Incremental signature counts for each configured log file."""

    name = "logs"

    def __init__(
        self,
        files: Iterable[str | Path],
        signatures: Sequence[LogSignature],
        state_path: Path | None,
        opener: Opener = FileHandle,
        engine: str = "auto",
        max_line: int = MAX_LINE_BYTES,
        max_read_per_scrape: int | None = MAX_READ_PER_SCRAPE,
    ):
        self.signatures = tuple(signatures)
        self.max_read_per_scrape = max_read_per_scrape
        self._budget_left: int | None = None
        self.scanner = LineScanner(self.signatures, engine=engine, max_line=max_line)
        self.state_path = state_path
        self.opener = opener
        self.bytes_read = 0
        self._lock = threading.Lock()
        self._saved = ""
        self._save_problem: str | None = None
        paths = sorted({os.path.abspath(str(f)) for f in files})
        self.logs = {p: LogState(p, {s.name: 0 for s in self.signatures}) for p in paths}
        self._load_state()

    # -- state file --

    def _load_state(self) -> None:
        if self.state_path is None:
            return
        try:
            raw = json.loads(self.state_path.read_text(encoding="utf-8"))
            files = raw["files"] if raw.get("version") == STATE_VERSION else {}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("log positions in %s unusable (%s); reading logs from the start",
                        self.state_path, exc)
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
                log.warning("saved position for %s unusable (%s); reading it from the start",
                            path, exc)
                state.counts = {s.name: 0 for s in self.signatures}
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
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".logs-", dir=self.state_path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(text)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.state_path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
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
        """Read the file up to `end` within this scrape's budget; True if it got there."""
        assert tracked.handle is not None
        budget = self._budget_left if limited else None
        spent, finished = self.scanner.consume(
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
                log.warning("log %s: the file read before (inode %d) is gone; lines written "
                            "to it after offset %d are not counted", state.path,
                            tracked.position.ino, tracked.position.offset)
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
                copy = TrackedFile(FilePosition(st.st_dev, st.st_ino, position.offset,
                                                position.skipping), handle)
                self._read(state, copy, handle.stat().st_size, final=True, limited=False)
                return
            finally:
                handle.close()
        log.warning("log %s was truncated and no copy was found beside it; lines written "
                    "after offset %d and before the truncation are not counted",
                    state.path, position.offset)

    def _update(self, state: LogState) -> None:
        try:
            path_stat: os.stat_result | None = os.stat(state.path)
        except FileNotFoundError:
            path_stat = None
        except OSError as exc:
            self._note(state, f"cannot stat: {exc.strerror or exc}")
            self._drain(state)
            return
        current = state.current
        if (current is not None and current.handle is None and path_stat is not None
                and current.position.is_file(path_stat)):
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
            and (len(head) < position.head_len
                 or _digest(head[: position.head_len]) != position.head_digest)
        )
        if replaced:
            self._recover_copy(state, position)
            position.offset, position.skipping = 0, False
        position.head_len, position.head_digest = len(head), _digest(head)
        self._read(state, current, st.st_size, final=False)
        state.unread = max(0, st.st_size - position.offset)
        self._note(state, None)

    # -- the collector --

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._budget_left = self.max_read_per_scrape
            for state in self.logs.values():
                try:
                    self._update(state)
                except OSError as exc:
                    self._note(state, f"read failed: {exc.strerror or exc}")
            self._save_state()
            errors = CounterMetricFamily(
                "mlx_log_errors",
                "Log lines matching each error signature, per service log (a line matching "
                "two signatures counts for both).",
                labels=["signature", "file"],
            )
            readable = GaugeMetricFamily(
                "mlx_log_file_readable",
                "1 if the log file could be read on this scrape, 0 if missing or unreadable.",
                labels=["file"],
            )
            unread = GaugeMetricFamily(
                "mlx_log_unread_bytes",
                f"Bytes of the log not read yet: each scrape reads at most "
                f"{self.max_read_per_scrape or 0} bytes (0: no limit) and catches up later.",
                labels=["file"],
            )
            for path, state in self.logs.items():
                for signature in self.signatures:
                    errors.add_metric([signature.name, path], state.counts[signature.name])
                readable.add_metric([path], 1.0 if state.readable else 0.0)
                unread.add_metric([path], state.unread if state.readable else 0.0)
            yield errors
            yield readable
            yield unread

    def close(self) -> None:
        with self._lock:
            for state in self.logs.values():
                for tracked in (state.current, *state.draining):
                    if tracked is not None:
                        tracked.close()


def service_logs(context: ExporterContext) -> list[Path]:
    """The log files of the models whose head (where the service runs) is this node."""
    return [p for m in context.models_here() if m.head == context.node for p in m.log_files]


@register("logs", help="count error signatures in the model services' logs")
def make(context: ExporterContext) -> Collector:
    collector = LogsCollector(
        service_logs(context),
        signatures_for(context.inventory),
        context.state_dir / STATE_FILE,
    )
    engine = collector.scanner.prefilter
    if collector.logs and isinstance(engine, FindPrefilter):
        log.info("logs: Hyperscan is not installed (no wheel for this platform); literals"
                 " are found with bytes.find, about a fifth of its speed")
    return collector
