"""The head of an HTTP/1.x message (a start line, then header lines up to a blank one),
read under the limits `http.server` applies, for the exporter's server and the health
probe's client, which both speak HTTP without the standard library's HTTP stack
(docs/decisions.md)."""

from __future__ import annotations

from typing import Protocol

MAX_LINE = 65536  # bytes of one start or header line
MAX_HEADERS = 100


class LineReader(Protocol):
    def readline(self, size: int, /) -> bytes: ...


class HeadError(ValueError):
    """The head breaks a limit or is not HTTP; `kind` says which: `line-too-long`,
    `too-many-headers` or `malformed`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def read_line(stream: LineReader, what: str) -> bytes:
    """One line, its end included (b"" at the end of the stream)."""
    line = stream.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise HeadError("line-too-long", f"{what} longer than {MAX_LINE} bytes")
    return line


def read_headers(stream: LineReader) -> dict[str, str]:
    """The header lines after the start line, by lower-case name (the first of each
    name), up to the blank line or the end of the stream."""
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = read_line(stream, "header line")
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, colon, value = line.decode("iso-8859-1").partition(":")
        if not colon:
            raise HeadError("malformed", f"not a header line: {line[:80]!r}")
        headers.setdefault(name.strip().lower(), value.strip())
    raise HeadError("too-many-headers", f"more than {MAX_HEADERS} header lines")
