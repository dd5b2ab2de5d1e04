"""Running mlx.launch on the head and watching it: its output streamed to the service
log line by line, a rank's end noticed (mlx.launch itself exits 0 when a rank failed, or
keeps the others running), JACCL errors noticed, and a bounded way to end it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable

from mlx_medic.serve.smoke import ANSI, LAUNCH_RANK_LINE
from mlx_medic.signatures import signatures_matching

SERVING_LINES_KEPT = 200  # a serving launch's output is the service log's; keep only a tail


def is_jaccl_error(line: str) -> bool:
    return any(name.startswith("jaccl") for name in signatures_matching(line))


class Launch:
    """One guarded mlx.launch, its output copied to this process's stdout."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
        keep: int | None = None,
    ):
        """`keep`: how many of the last output lines `lines` holds (None: all, for a
        smoke test judged by its whole output)."""
        self.argv = argv
        self.env = env
        self.on_line = on_line
        self.process: asyncio.subprocess.Process | None = None
        self.lines: deque[str] = deque(maxlen=keep)
        self.rank_ended: str | None = None  # the first "Node with rank N ..." line
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while raw := await next_line(self.process.stdout):
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            line = ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\n")
            self.lines.append(line)
            if self.rank_ended is None and LAUNCH_RANK_LINE.search(line):
                self.rank_ended = line.strip()
            if self.on_line is not None:
                self.on_line(line)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def wait(self, timeout: float | None = None) -> int | None:
        """mlx.launch's exit status once its output is read; None at the time limit."""
        assert self.process is not None and self._reader is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._finish()), timeout)
        except TimeoutError:
            return None
        return self.process.returncode

    async def _finish(self) -> None:
        assert self.process is not None and self._reader is not None
        await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, 5.0)

    async def end(self, grace: float) -> None:
        """SIGTERM (mlx.launch has no handler: it just dies), then SIGKILL after `grace`."""
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)
        if await self.wait(grace) is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            await self.wait(5.0)


async def next_line(stream: asyncio.StreamReader) -> bytes:
    """The next line, b"" at the end. A line longer than the stream's limit comes in
    pieces (asyncio's readline would drop it and raise, ending the copy to the log)."""
    try:
        return await stream.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial  # the last line, without a newline
    except asyncio.LimitOverrunError as exc:
        return await stream.read(max(exc.consumed, 1))


def remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
