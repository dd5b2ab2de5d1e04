"""Where each of a model's service logs ends when its service is started: the start's
mark. `node service MODEL start` reports it, `node facts MODEL` reports each error line's
byte offset and each log's size, so a verify tells the lines this start wrote from older
ones (a site's start script that hits `Couldn't allocate protection domain` escalates
at once instead of after the model's whole start_timeout)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def log_sizes(files: Sequence[Path]) -> dict[str, int | None]:
    """Each file's size in bytes; None where it cannot be read (not written yet)."""
    sizes: dict[str, int | None] = {}
    for path in files:
        try:
            sizes[str(path)] = os.stat(path).st_size
        except OSError:
            sizes[str(path)] = None
    return sizes


def written_after(
    file: str | None, offset: int | None, marks: Mapping[str, int | None], sizes: Mapping[str, Any]
) -> bool:
    """Whether a log line at `offset` of `file` was written after the file's mark: at or
    past the mark, or anywhere in a file that had none (not there yet) or has shrunk below
    it since (rotated or truncated). A line of a file without a mark, or without an
    offset, is not known to be new: False."""
    if file is None or file not in marks or offset is None:
        return False
    mark = marks[file]
    size = sizes.get(file)
    if mark is None or (isinstance(size, int) and size < mark):
        return True
    return offset >= mark
