"""supervisord's XML-RPC interface over its unix socket: what `supervisorctl -c CONFIG
stop|start|restart NAME` asks supervisord, asked without starting supervisorctl.

supervisorctl is a Python program of its own: about 0.1 s of CPU a call, twice per
recovery, on a head that is busy restarting its model. The helper asks the same calls
(`supervisor.stopProcess`, `supervisor.startProcess`, both waiting for the state change, as
supervisorctl does) over the socket the config's `[supervisorctl] serverurl` names, and
counts the answers as supervisorctl does: a stop of a stopped program and a start of a
running one succeed. Where the socket is: mlx_medic.platform.supervisord_config.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.parse
import xmlrpc.client
from pathlib import Path

from mlx_medic.platform.supervisord_config import SupervisorSocket
from mlx_medic.service_manager import ServiceAction

# supervisor.xmlrpc.Faults (supervisor 4.2.5), the codes an answer is read by
BAD_NAME = 10
NO_FILE = 20
NOT_EXECUTABLE = 21
ABNORMAL_TERMINATION = 40
SPAWN_ERROR = 50
ALREADY_STARTED = 60
NOT_RUNNING = 70
# supervisorctl's own wording of a fault, per code (supervisorctl._startresult, _signalresult)
FAULT_WORDS = {
    BAD_NAME: "no such process",
    NO_FILE: "no such file",
    NOT_EXECUTABLE: "file is not executable",
    ABNORMAL_TERMINATION: "abnormal termination",
    SPAWN_ERROR: "spawn error",
    ALREADY_STARTED: "already started",
    NOT_RUNNING: "not running",
}
# what each action asks, in order, and the fault that means "already so"
CALLS: dict[ServiceAction, tuple[tuple[str, int, str], ...]] = {
    "stop": (("supervisor.stopProcess", NOT_RUNNING, "stopped"),),
    "start": (("supervisor.startProcess", ALREADY_STARTED, "started"),),
    "restart": (
        ("supervisor.stopProcess", NOT_RUNNING, "stopped"),
        ("supervisor.startProcess", ALREADY_STARTED, "started"),
    ),
}


def methods(action: ServiceAction) -> list[str]:
    """The XML-RPC methods an action calls, in order."""
    return [method for method, _, _ in CALLS[action]]


def ask_supervisord(
    where: SupervisorSocket, action: ServiceAction, name: str, timeout: float
) -> tuple[int | None, str, str]:
    """(0 done / 1 refused / None not answered, stdout, stderr), worded as supervisorctl
    words them: `NAME: stopped`, `NAME: ERROR (not running)`. `timeout` bounds all of
    it (a restart's stop and start together)."""
    deadline = time.monotonic() + timeout
    transport = _UnixSocketTransport(where.path, timeout)
    proxy = xmlrpc.client.ServerProxy(_rpc_url(where), transport=transport)
    lines: list[str] = []
    try:
        for method, already, done in CALLS[action]:
            transport.limit(deadline - time.monotonic())
            try:
                getattr(proxy, method)(name)
            except xmlrpc.client.Fault as fault:
                words = FAULT_WORDS.get(fault.faultCode, fault.faultString)
                lines.append(f"{name}: ERROR ({words})")
                if fault.faultCode != already:
                    return 1, _text(lines), f"supervisord: {fault.faultString}\n"
            else:
                lines.append(f"{name}: {done}")
    except xmlrpc.client.ProtocolError as exc:
        return None, _text(lines), f"{where.url}: {exc.errcode} {exc.errmsg}\n"
    except TimeoutError:
        return None, _text(lines), f"{where.url} did not answer within {timeout:g}s\n"
    except (OSError, http.client.HTTPException, xmlrpc.client.Error) as exc:
        return None, _text(lines), f"{where.url}: {exc}\n"
    finally:
        proxy("close")()
    return 0, _text(lines), ""


def _text(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def _rpc_url(where: SupervisorSocket) -> str:
    """supervisorctl's URL for a unix socket; the credentials as basic auth."""
    if where.username is None:
        return "http://127.0.0.1/RPC2"
    user = urllib.parse.quote(where.username, safe="")
    password = urllib.parse.quote(where.password or "", safe="")
    return f"http://{user}:{password}@127.0.0.1/RPC2"


class _UnixSocketConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float):
        super().__init__("127.0.0.1", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.socket_path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixSocketTransport(xmlrpc.client.Transport):
    def __init__(self, path: Path, timeout: float):
        super().__init__()
        self.socket_path = path
        self.timeout = timeout

    def limit(self, seconds: float) -> None:
        """The time the next call may take, the open connection's too."""
        if seconds <= 0:
            raise TimeoutError
        self.timeout = seconds
        connection = self._connection[1]
        if connection is not None and connection.sock is not None:
            connection.sock.settimeout(seconds)

    def make_connection(self, host: object) -> http.client.HTTPConnection:
        if self._connection[1] is not None and host == self._connection[0]:
            return self._connection[1]  # the same request's retry, or the next call
        _, self._extra_headers, _ = self.get_host_info(host)  # type: ignore[arg-type]
        connection = _UnixSocketConnection(self.socket_path, self.timeout)
        self._connection = (host, connection)  # type: ignore[assignment]
        return connection
