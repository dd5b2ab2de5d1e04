"""The client of a node's helper session (`mlx-medic node session`,
mlx_medic.node.session): many helper calls over one login.

A session is one process on the node that forks a child per request, so a call costs
the node a fork instead of sshd's session, a shell and a Python start (bench/helper_start:
about nine tenths of a helper's CPU). The transport that opened it (SSH) sends each
helper call through it, and falls back to a process per call when the node cannot run
one (an older mlx-medic, a forced command that does not grant it).

The session's reply carries what a process per call would have: the exit status (None
when a signal ended it), stdout and stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from mlx_medic.transport.interface import CommandResult, TransportError

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Node

PROTOCOL = 1  # mlx_medic.node.session.PROTOCOL, what this client speaks
NOT_THROUGH_A_SESSION = ("session", "forced-command")


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class Reader(Protocol):
    async def readline(self) -> bytes: ...


class SessionUnavailable(Exception):
    """The node did not open a session (its reason): calls go one process each."""


class SessionRetry(Exception):
    """The request was not run and a new session would run it (the session ended before
    it was sent, or mlx-medic changed under it)."""


def session_argv(node: Node) -> list[str]:
    """How a session is asked for: a helper call like any other, the forced command's."""
    return [
        node.medic_command,
        "node",
        "session",
        "--inventory",
        str(node.medic_config),
        "--node",
        node.name,
    ]


def through_a_session(node: Node, argv: list[str]) -> bool:
    """Whether `argv` is a helper call a session runs: `<medic_command> node HELPER ...`."""
    return (
        len(argv) > 2
        and argv[0] == node.medic_command
        and argv[1] == "node"
        and argv[2] not in NOT_THROUGH_A_SESSION
    )


class HelperSession:
    """One node's session: requests written on its stdin, replies read from its stdout
    by one reader task and handed to their callers by id."""

    def __init__(
        self,
        node: str,
        stdin: Writer,
        stdout: Reader,
        stderr: Reader,
        close: Callable[[], None],
    ):
        self.node = node
        self._stdin = stdin
        self._stdout = stdout
        self._close = close
        self._stderr_reader = asyncio.create_task(self._read_stderr(stderr))
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.stderr: deque[str] = deque(maxlen=20)  # the session's own last words
        self.ended: str | None = None  # why it ended, once it has
        self.version: str | None = None
        self.pid: int | None = None  # the session's pid on its node

    async def start(self, timeout: float) -> None:
        """Wait for its hello; SessionUnavailable when none comes."""
        try:
            line = await asyncio.wait_for(self._stdout.readline(), timeout)
        except TimeoutError:
            self.close("no hello")
            raise SessionUnavailable(f"no hello within {timeout:g}s") from None
        except Exception as exc:  # any failure to read means no session
            self.close(str(exc))
            raise SessionUnavailable(f"cannot read its hello: {exc}") from None
        hello = _json_object(line)
        if hello is None or hello.get("session") != PROTOCOL:
            if not line:  # it ended: its last words say why (a refusal, an unknown helper)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._stderr_reader), 2)
            said = " ".join(self.stderr).strip() or line.decode("utf-8", "replace").strip()
            self.close("no hello")
            raise SessionUnavailable(f"it did not say hello: {said[-300:] or 'it ended'}")
        self.version = str(hello.get("version"))
        self.pid = hello.get("pid") if isinstance(hello.get("pid"), int) else None
        self._reader = asyncio.create_task(self._read_replies())

    async def run(self, argv: list[str], timeout: float) -> CommandResult:
        """The call's result; SessionRetry when it was not run; TransportError when the
        session ended while it ran (whether it ran is not known)."""
        if self.ended is not None:
            raise SessionRetry(self.ended)
        request_id = next(self._ids)
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = reply
        try:
            try:
                self._stdin.write(json.dumps({"id": request_id, "argv": argv}).encode() + b"\n")
                await self._stdin.drain()
            except Exception as exc:  # a write that failed sent nothing whole
                self.close(f"cannot write to it: {exc}")
                raise SessionRetry(f"cannot write to it: {exc}") from None
            try:
                answer = await asyncio.wait_for(asyncio.shield(reply), timeout)
            except TimeoutError:
                return CommandResult(None, "", "", timed_out=True)
        finally:
            self._waiting.pop(request_id, None)
        if "retry" in answer:
            self.close(f"it asked for a new session: {answer['retry']}")
            raise SessionRetry(str(answer["retry"]))
        if "error" in answer:
            raise TransportError(f"{self.node}: the helper session refused the call: {answer}")
        status = answer.get("exit_status")
        return CommandResult(
            status if isinstance(status, int) else None,
            str(answer.get("stdout", "")),
            str(answer.get("stderr", "")),
        )

    async def _read_stderr(self, stderr: Reader) -> None:
        with contextlib.suppress(Exception):
            while line := await stderr.readline():
                self.stderr.append(line.decode("utf-8", "replace").rstrip())

    async def _read_replies(self) -> None:
        why = "it ended"
        try:
            while line := await self._stdout.readline():
                answer = _json_object(line)
                if answer is None:
                    continue
                waiting = self._waiting.get(answer.get("id"))  # type: ignore[arg-type]
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
        except Exception as exc:  # the channel broke: the session is gone
            why = f"its channel broke: {exc}"
        said = " ".join(self.stderr).strip()
        self._end(f"{why}{': ' + said[-300:] if said else ''}")

    def _end(self, why: str) -> None:
        if self.ended is None:
            self.ended = why
        lost = TransportError(f"{self.node}: the helper session ended during the call ({why})")
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(lost)

    def close(self, why: str = "closed") -> None:
        self._end(why)
        with contextlib.suppress(Exception):
            self._close()
        for task in (self._reader, self._stderr_reader):
            if task is not None and task is not asyncio.current_task():
                task.cancel()


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
