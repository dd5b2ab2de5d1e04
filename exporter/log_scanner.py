"""Counts error signatures in byte ranges of a log: the reader the log follower feeds.

Reading is chunked over bytes: a prefilter finds the signatures' literal anchors
(Hyperscan when installed, else `bytes.find` per anchor) and only the lines containing
one are decoded and matched. Lines are split on `\\n`; only the first `MAX_LINE_BYTES` of
a line are examined; a partial last line waits for its newline. Hyperscan is loaded on the
first bytes there are to scan, so an exporter with no log to read never pays for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from mlx_medic.exporter.log_follower import FilePosition, LogHandle
from mlx_medic.signatures import LogSignature, merged_anchors

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 64 * 1024
ENGINES = ("auto", "hyperscan", "find")


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


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"unknown prefilter engine {engine!r}; use auto, hyperscan or find")
    return engine


def make_prefilter(anchors: Sequence[bytes], engine: str = "auto") -> Prefilter:
    if check_engine(engine) != "find":
        try:
            return HyperscanPrefilter(anchors)
        except ImportError:
            if engine == "hyperscan":
                raise
    return FindPrefilter(anchors)


class LineScanner:
    """Counts signature matches in byte ranges: each line at most once per signature."""

    def __init__(
        self,
        signatures: Sequence[LogSignature],
        engine: str = "auto",
        max_line: int = MAX_LINE_BYTES,
        chunk: int = CHUNK_BYTES,
    ):
        self.engine = check_engine(engine)
        self.max_line = max_line
        self.chunk = chunk
        self.anchored = [s for s in signatures if s.anchors and b"\n" not in b"".join(s.anchors)]
        self.unanchored = [s for s in signatures if s not in self.anchored]
        self._prefilter: Prefilter | None = None

    @property
    def prefilter(self) -> Prefilter | None:
        """Built on first use: the anchored signatures' literals, in the chosen engine."""
        if self._prefilter is None and self.anchored:
            anchors = [a for s in self.anchored for a in s.anchors]
            self._prefilter = make_prefilter(anchors, self.engine)
        return self._prefilter

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
        prefilter = self.prefilter
        if prefilter is not None:
            starts: set[int] = set()
            for hit in prefilter.hits(buf, lo, hi):
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
