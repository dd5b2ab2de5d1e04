"""The model health probe, shared by the exporter and the remediator.

A model is up only when its port accepts a connection AND a real one-token
completion comes back within the timeout. `/health` is not proof:
mlx_lm.server answers it while its ranks hang in a collective. Probes of one
server never overlap (a per-target lock, optionally also a file lock shared
with other processes on the node), because two concurrent requests can crash
both JACCL ranks (mlx-lm#1737). The deadline is strict: a server that accepts
and then trickles bytes or says nothing reads down when the timeout expires.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, ParamSpec, TypeVar

from mlx_medic import http_head
from mlx_medic.log_on_use import logger
from mlx_medic.state.layout import Owner, StateFileError, ensure_dir, locks_dir, open_lock_file

LOGGER = __name__  # mlx_medic.log_on_use: logging is imported when it logs

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
PROBE_PATHS = (CHAT_PATH, COMPLETIONS_PATH)
MAX_RESPONSE_BYTES = 1 << 20
_LOCK_POLL_SECONDS = 0.05

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class ProbeResult:
    """`up` only after a real completion; `reason` says why in words for on-call.

    `conclusive` is False when no request was sent (another probe of the same
    server held the lock too long): callers that act on "down" must not act
    on an inconclusive result.
    """

    up: bool
    reason: str
    latency_seconds: float
    conclusive: bool = True
    timed_out: bool = False  # no answer within the timeout: slow or hung, not refused


@dataclass(frozen=True)
class ProbeAnswer:
    """A probe's verdict as it leaves the node: the line `mlx-medic probe` prints, the
    verdict in `mlx-medic node probe`'s document, read back by the remediator."""

    up: bool
    conclusive: bool
    reason: str
    latency_seconds: float

    @classmethod
    def of(cls, result: ProbeResult) -> ProbeAnswer:
        return cls(result.up, result.conclusive, result.reason, round(result.latency_seconds, 6))

    def to_document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> ProbeAnswer:
        """ValueError when the document carries no verdict."""
        up, conclusive = document.get("up"), document.get("conclusive")
        reason, latency = document.get("reason"), document.get("latency_seconds", 0.0)
        if not (
            isinstance(up, bool)
            and isinstance(conclusive, bool)
            and isinstance(reason, str)
            and isinstance(latency, int | float)
        ):
            raise ValueError("no verdict (up, conclusive, reason)")
        return cls(up, conclusive, reason[:500], float(latency))


def _request_body(path: str) -> bytes:
    # No "model" field: mlx_lm.server would try to load a model by that name.
    if path == CHAT_PATH:
        body: dict[str, object] = {"messages": [{"role": "user", "content": "ping"}]}
    else:
        body = {"prompt": "ping"}
    body.update(max_tokens=1, temperature=0.0, stream=False)
    return json.dumps(body).encode()


# A server listening on every address is probed on its node's loopback of the same family.
_LOOPBACK_FOR_WILDCARD = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
WILDCARD_HOSTS = frozenset(_LOOPBACK_FOR_WILDCARD)


def probe_host(listen_host: str) -> str:
    """Where to probe, on its own node, a server that listens on `listen_host`.

    The one mapping every prober on a node uses, so that they all name the same
    target and so take the same probe lock file (see `_lock_file_name`).
    """
    return _LOOPBACK_FOR_WILDCARD.get(listen_host, listen_host)


def _check_target(host: str, port: int, timeout: float, path: str) -> None:
    if not isinstance(host, str) or not host or any(c.isspace() for c in host) or "/" in host:
        raise ValueError(f"probe host {host!r} is not a host name or address")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"probe port {port!r} is not a TCP port (1-65535)")
    if not timeout > 0:
        raise ValueError(f"probe timeout {timeout!r} must be a positive number of seconds")
    if path not in PROBE_PATHS:
        raise ValueError(f"probe path {path!r} is not one of {PROBE_PATHS}")


# --- one probe at a time per server ---------------------------------------

_registry_lock = threading.Lock()
_target_locks: dict[tuple[str, int], threading.Lock] = {}


def _target_lock(host: str, port: int) -> threading.Lock:
    with _registry_lock:
        return _target_locks.setdefault((host, port), threading.Lock())


def probe_lock_dir(state_dir: Path, owner: Owner | None = None) -> Path:
    """`<state_dir>/locks`, made if need be (for `owner`, else its parent's): where every
    prober on a node (the exporter, a sweep, `mlx-medic node probe`) flocks a server's
    probe lock. StateFileError saying whose it is when this process cannot use it."""
    return ensure_dir(locks_dir(state_dir), owner)


def shared_probe_lock_dir(state_dir: Path, owner: Owner | None = None) -> Path | None:
    """`probe_lock_dir`, or None (logged) when it cannot be made: the caller then probes
    under its in-process lock only, rather than not at all."""
    try:
        return probe_lock_dir(state_dir, owner)
    except (OSError, StateFileError) as exc:
        logger(LOGGER).warning("%s: probes are serialized within this process only", exc)
        return None


def _lock_file_name(host: str, port: int) -> str:
    safe = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    return f"probe-{safe}-{port}.lock"


@contextlib.contextmanager
def _exclusive(host: str, port: int, wait: float, lock_dir: Path | None) -> Iterator[bool]:
    """Hold the in-process lock (and the file lock in `lock_dir`) or yield False."""
    deadline = time.monotonic() + wait
    lock = _target_lock(host, port)
    if not lock.acquire(timeout=max(wait, 0.0)):
        yield False
        return
    try:
        if lock_dir is None:
            yield True
            return
        # Owned by the state dir's owner whoever makes it (the root exporter, the node's
        # login user): every prober on the node must be able to open and flock it.
        fd = open_lock_file(lock_dir / _lock_file_name(host, port))
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(_LOCK_POLL_SECONDS)
            yield True
        finally:
            os.close(fd)  # closing drops the flock
    finally:
        lock.release()


# --- the request itself ----------------------------------------------------


def _describe_os_error(exc: OSError, host: str, port: int) -> str:
    if exc.errno == errno.ECONNREFUSED:
        return f"connection refused: nothing listens on {host}:{port}"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{host}:{port} is unreachable ({exc.strerror})"
    return f"cannot talk to {host}:{port}: {exc.strerror or exc}"


def _judge(status: int, body: bytes, path: str) -> tuple[bool, str]:
    if status != 200:
        return False, f"HTTP {status} from POST {path}"
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False, f"POST {path} answered 200 but not with JSON"
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices:
        return False, f"POST {path} answered 200 without a completion (no choices)"
    return True, f"completed a 1-token request on POST {path}"


class ProtocolError(Exception):
    """The server's answer is not the HTTP the probe reads."""


def _read_line(reply: BinaryIO, what: str) -> bytes:
    try:
        return http_head.read_line(reply, what)
    except http_head.HeadError as exc:
        raise ProtocolError(str(exc)) from None


def _read_head(reply: BinaryIO) -> tuple[int, dict[str, str]]:
    """The status and the headers (lower-case names) of one response."""
    line = _read_line(reply, "status line")
    if not line:
        raise ProtocolError("the server closed the connection without an answer")
    words = line.decode("iso-8859-1").split(None, 2)
    if len(words) < 2 or not words[0].startswith("HTTP/") or not words[1].isdigit():
        raise ProtocolError(f"not an HTTP status line: {line[:80]!r}")
    try:
        return int(words[1]), http_head.read_headers(reply)
    except http_head.HeadError as exc:
        raise ProtocolError(str(exc)) from None


def _read_chunked(reply: BinaryIO) -> bytes:
    parts: list[bytes] = []
    left = MAX_RESPONSE_BYTES
    while left > 0:
        size_text = _read_line(reply, "chunk size").split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            break
        data = reply.read(min(size, left))
        if len(data) < min(size, left):
            raise ProtocolError("the answer ended inside a chunk")
        parts.append(data)
        left -= len(data)
        if left > 0:
            _read_line(reply, "chunk end")
    return b"".join(parts)


def _read_body(reply: BinaryIO, headers: Mapping[str, str]) -> bytes:
    """At most MAX_RESPONSE_BYTES: by chunks, by Content-Length or up to the close."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _read_chunked(reply)
    length = headers.get("content-length")
    if length is None:
        return reply.read(MAX_RESPONSE_BYTES)  # Connection: close ends it
    try:
        wanted = min(int(length), MAX_RESPONSE_BYTES)
    except ValueError:
        raise ProtocolError(f"bad Content-Length {length[:20]!r}") from None
    data = reply.read(wanted)
    if len(data) < wanted:
        raise ProtocolError(f"the answer ended after {len(data)} of {length} bytes")
    return data


def _exchange(sock: socket.socket, host: str, port: int, path: str) -> tuple[int, bytes]:
    """POST the one-token request on `sock`; (status, body) of the final answer.

    A plain HTTP/1.1 client on the socket, not http.client: that imports `ssl` (libssl,
    libcrypto) and `email`, 4 MiB of the exporter's resident memory (bench/busy_node)."""
    body = _request_body(path)
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {authority}\r\nAccept-Encoding: identity\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    sock.sendall(head.encode("ascii") + body)
    with sock.makefile("rb") as reply:
        status, headers = _read_head(reply)
        while 100 <= status < 200:  # interim (100 Continue): the answer follows
            status, headers = _read_head(reply)
        return status, _read_body(reply, headers)


def _request(host: str, port: int, timeout: float, path: str) -> tuple[bool, str, bool]:
    """One POST with a strict overall deadline.

    Socket timeouts bound each read, not the whole exchange; a watchdog timer
    shuts the socket down at the deadline so a server that trickles bytes
    cannot hold the probe longer than `timeout`.
    """
    expired = threading.Event()
    connected: list[socket.socket] = []

    def expire() -> None:
        expired.set()
        for sock in connected:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            connected.append(socket.create_connection((host, port), timeout=timeout))
        except TimeoutError:
            return False, f"could not connect to {host}:{port} within {timeout:g}s", True
        if expired.is_set():  # the watchdog fired before there was a socket to shut
            raise TimeoutError
        status, payload = _exchange(connected[0], host, port, path)
        if expired.is_set():
            raise TimeoutError
        return (*_judge(status, payload, path), False)
    except TimeoutError:
        return False, f"no complete answer from POST {path} within {timeout:g}s", True
    except (ProtocolError, OSError) as exc:
        if expired.is_set():
            return False, f"no complete answer from POST {path} within {timeout:g}s", True
        if isinstance(exc, OSError) and exc.errno is not None:
            return False, _describe_os_error(exc, host, port), False
        return False, f"POST {path} failed: {type(exc).__name__}: {exc}", False
    finally:
        watchdog.cancel()
        for sock in connected:
            sock.close()


def probe_model(
    host: str,
    port: int,
    *,
    timeout: float,
    path: str = CHAT_PATH,
    lock_wait: float | None = None,
    lock_dir: Path | None = None,
) -> ProbeResult:
    """Is the model on host:port serving? Connects only to host:port.

    Waits up to `lock_wait` (default: `timeout` plus a second, the longest a
    same-timeout probe can hold the lock) for other probes of this server to
    finish. `lock_dir` adds a file lock there, so probes from the exporter and
    the remediator on one node do not overlap either; a lock file this process cannot
    open is a StateFileError naming its owner (never a probe without the lock).
    """
    _check_target(host, port, timeout, path)
    wait = timeout + 1.0 if lock_wait is None else lock_wait
    with _exclusive(host, port, wait, lock_dir) as held:
        if not held:
            return ProbeResult(
                up=False,
                conclusive=False,
                latency_seconds=0.0,
                reason=f"not probed: another probe of {host}:{port} ran longer than {wait:g}s",
            )
        start = time.monotonic()
        up, reason, timed_out = _request(host, port, timeout, path)
        return ProbeResult(
            up=up, reason=reason, latency_seconds=time.monotonic() - start, timed_out=timed_out
        )


def _in_worker_thread(function: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """`function` for asyncio callers: the same code, run in a worker thread."""

    async def in_thread(*args: P.args, **kwargs: P.kwargs) -> R:
        import asyncio  # here: the exporter and `mlx-medic probe` never load asyncio

        return await asyncio.to_thread(function, *args, **kwargs)

    in_thread.__name__ = in_thread.__qualname__ = f"{function.__name__}_async"
    in_thread.__doc__ = f"`{function.__name__}` for asyncio callers, run in a worker thread."
    return in_thread


# The same code in a thread, so sync and async probes share one lock. If the caller
# is cancelled, the thread still finishes within its deadline and releases the lock.
probe_model_async = _in_worker_thread(probe_model)
