"""`with` support for testbed objects whose `close()` ends everything they started."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class ClosedOnExit:
    """`with thing:` calls `thing.close()` at the end of the block, even when it fails."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
