"""One login that runs many node helpers: the helper session's loop.

Why: a helper started as its own process (sshd's session, a shell, a Python interpreter,
its imports) spends about nine tenths of its CPU on that start (bench/helper_start), and
a recovery runs one on every node at every step. A session is started once per node and
connection (`mlx-medic node session`), imports every helper's code once, and forks a
child per request: the child is a fresh helper in all that matters (its own process
group, its own stdin, stdout and stderr, its time limit, the inventory read again),
without the start.

The protocol, one JSON object per line each way:
- the session says hello first, once its code is loaded:
  `{"session": 1, "version": V, "pid": P}`;
- a request is `{"id": N, "argv": [WORD, ...]}`: a helper's command line as the client
  would have run it (`mlx-medic node HELPER ...`);
- its reply is `{"id": N, "exit_status": S, "signal": G, "stdout": ..., "stderr": ...}`
  (S null when a signal G ended it), or `{"id": N, "retry": WHY}` when it was not run
  and a new session would run it (mlx-medic changed under this one: from then on every
  request is sent back so, and the client closes it), or `{"id": N, "error": WHY}` for a
  line that is not a request (nothing was run).
Requests run at once, each in its own child: a slow helper never holds up another.
The session ends when its stdin closes, after its running children have replied.

Single-threaded on purpose (a selector over stdin, the children's pipes and a SIGCHLD
wakeup pipe): a fork from a process with other threads may copy a lock held mid-use.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROTOCOL = 1
MAX_LINE = 1 << 20  # a request is a command line: a megabyte is never one

RunRequest = Callable[[list[str]], int]  # runs in the child: the helper's exit status
CodeStamp = tuple[tuple[int, int, int], ...]

__all__ = ["PROTOCOL", "HelperSession", "code_stamp", "package_paths"]


def package_paths() -> list[Path]:
    """What a new install of mlx-medic replaces: its package dir, its `__init__.py` and
    the node helpers' dir (pip removes and writes them; an editor's save renames)."""
    package = Path(__file__).resolve().parents[1]
    return [package, package / "__init__.py", package / "node"]


def code_stamp(paths: Sequence[Path]) -> CodeStamp:
    """Each path's (device, inode, mtime); (0, 0, 0) for one that is gone."""
    stamps = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append((0, 0, 0))
        else:
            stamps.append((st.st_dev, st.st_ino, st.st_mtime_ns))
    return tuple(stamps)


@dataclass
class _Child:
    request_id: int
    pid: int
    stdout_fd: int  # the other pipe in `output` is its stderr
    output: dict[int, bytearray] = field(default_factory=dict)  # open pipe -> what it wrote
    stdout: bytes = b""
    stderr: bytes = b""
    status: int | None = None  # the wait status, once reaped

    @property
    def done(self) -> bool:
        return self.status is not None and not self.output


class HelperSession:
    """Reads requests on `stdin_fd`, runs each with `run_request` in a forked child, and
    writes each reply on `stdout_fd` as it ends."""

    def __init__(
        self,
        run_request: RunRequest,
        version: str,
        *,
        stdin_fd: int = 0,
        stdout_fd: int = 1,
        watched: Sequence[Path] | None = None,
    ):
        self.run_request = run_request
        self.version = version
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.watched = list(package_paths() if watched is None else watched)
        self.stamp = code_stamp(self.watched)
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, _Child] = {}  # pid -> child
        self.by_fd: dict[int, _Child] = {}  # a child's pipe -> the child
        self.pending = bytearray()  # stdin's unfinished line
        self.taking = True  # False once stdin closed
        self.changed: str | None = None  # why no request runs here any more
        self.wakeup_r, self.wakeup_w = os.pipe()

    # --- the loop ------------------------------------------------------------------------
    def serve(self) -> int:
        """Serve until stdin closes and every child has replied; the exit status (0)."""
        for fd in (self.wakeup_r, self.wakeup_w):
            os.set_blocking(fd, False)
        previous_wakeup = signal.set_wakeup_fd(self.wakeup_w)
        previous_handler = signal.signal(signal.SIGCHLD, _on_sigchld)
        try:
            self.selector.register(self.wakeup_r, selectors.EVENT_READ)
            self.selector.register(self.stdin_fd, selectors.EVENT_READ)
            self._write({"session": PROTOCOL, "version": self.version, "pid": os.getpid()})
            while self.taking or self.children:
                for key, _ in self.selector.select():
                    fd = int(key.fd)
                    if fd == self.wakeup_r:
                        self._drain_wakeup()
                        self._reap()
                    elif fd == self.stdin_fd:
                        if self.taking:
                            self._read_requests()
                    elif fd in self.by_fd:  # not closed by a reap earlier in this round
                        self._read_child(fd)
        finally:
            signal.signal(signal.SIGCHLD, previous_handler)
            signal.set_wakeup_fd(previous_wakeup)
            self.selector.close()
            os.close(self.wakeup_r)
            os.close(self.wakeup_w)
        return 0

    def _stop_taking(self) -> None:
        if self.taking:
            self.taking = False
            self.selector.unregister(self.stdin_fd)

    def _read_requests(self) -> None:
        data = os.read(self.stdin_fd, 65536)
        if not data:
            self._stop_taking()
            return
        self.pending += data
        while b"\n" in self.pending:
            line, _, rest = bytes(self.pending).partition(b"\n")
            self.pending = bytearray(rest)
            if line.strip():
                self._request(line)
        if len(self.pending) > MAX_LINE:
            self.pending.clear()
            self._write({"id": None, "error": f"a request line longer than {MAX_LINE} bytes"})

    def _request(self, line: bytes) -> None:
        try:
            request = json.loads(line)
        except ValueError as exc:
            self._write({"id": None, "error": f"not JSON: {exc}"})
            return
        request_id = request.get("id") if isinstance(request, dict) else None
        argv = request.get("argv") if isinstance(request, dict) else None
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            self._write({"id": None, "error": "a request needs an integer id"})
            return
        if not (isinstance(argv, list) and argv and all(isinstance(w, str) for w in argv)):
            self._write({"id": request_id, "error": "argv must be a list of strings"})
            return
        if self.changed is None and code_stamp(self.watched) != self.stamp:
            self.changed = "mlx-medic changed on this node"
        if self.changed is not None:  # every request from now on: the client opens a new one
            self._write({"id": request_id, "retry": self.changed})
            return
        self._fork(request_id, argv)

    # --- children ------------------------------------------------------------------------
    def _fork(self, request_id: int, argv: list[str]) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(out_r)
            os.close(err_r)
            self._become_helper(out_w, err_w, argv)
        os.close(out_w)
        os.close(err_w)
        child = _Child(request_id, pid, out_r, {out_r: bytearray(), err_r: bytearray()})
        self.children[pid] = child
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            self.by_fd[fd] = child
            self.selector.register(fd, selectors.EVENT_READ)

    def _become_helper(self, out_w: int, err_w: int, argv: list[str]) -> None:
        status = 1
        try:
            os.setpgid(0, 0)  # its own group: its time limit ends it and its children only
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in [self.wakeup_r, self.wakeup_w, self.stdin_fd, *self.by_fd]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                os.close(self.selector.fileno())
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in {null, out_w, err_w} - {0, 1, 2}:
                os.close(fd)
            gc.enable()
            status = _exit_status(lambda: self.run_request(argv))
        except BaseException:  # the child must reach os._exit
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(status)

    def _read_child(self, fd: int) -> None:
        child = self.by_fd[fd]
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if data:
            child.output[fd] += data
            return
        self._close_pipe(child, fd)
        self._finish_if_done(child)

    def _close_pipe(self, child: _Child, fd: int) -> None:
        self.selector.unregister(fd)
        del self.by_fd[fd]
        os.close(fd)
        written = bytes(child.output.pop(fd))
        if fd == child.stdout_fd:
            child.stdout = written
        else:
            child.stderr = written

    def _drain_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wakeup_r, 512):
                pass

    def _reap(self) -> None:
        for pid, child in list(self.children.items()):
            if child.status is not None:
                continue
            try:
                reaped, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                reaped, status = pid, 0
            if reaped == 0:
                continue
            child.status = status
            # What it wrote before it ended is in its pipes; a process it left holding
            # them (a daemon it started) does not hold up its reply.
            for fd in list(child.output):
                with contextlib.suppress(BlockingIOError):
                    while data := os.read(fd, 65536):
                        child.output[fd] += data
                self._close_pipe(child, fd)
            self._finish_if_done(child)

    def _finish_if_done(self, child: _Child) -> None:
        if not child.done or child.pid not in self.children:
            return
        del self.children[child.pid]
        assert child.status is not None
        code = os.waitstatus_to_exitcode(child.status)
        self._write(
            {
                "id": child.request_id,
                "exit_status": code if code >= 0 else None,
                "signal": -code if code < 0 else None,
                "stdout": child.stdout.decode("utf-8", "replace"),
                "stderr": child.stderr.decode("utf-8", "replace"),
            }
        )

    def _write(self, message: dict[str, object]) -> None:
        data = (json.dumps(message) + "\n").encode()
        try:
            while data:
                written = os.write(self.stdout_fd, data)
                data = data[written:]
        except BrokenPipeError:  # the client went away: its replies have no reader
            self._stop_taking()


def _on_sigchld(_signum: int, _frame: object) -> None:
    """Nothing: the wakeup fd tells the loop a child ended."""


def _exit_status(run: Callable[[], int]) -> int:
    """`run()`'s status as a process exit status, SystemExit's included."""
    try:
        return int(run())
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
