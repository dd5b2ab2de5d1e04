"""Small real servers on 127.0.0.1 for probe tests: each binds an ephemeral
port (the test's unique token) and is stopped by the fixture that started it."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CountingCompletionServer:
    """Answers POST completions after `delay` s and records the most requests in flight."""

    def __init__(self, delay: float = 0.0, status: int = 200, body: bytes | None = None):
        self.delay = delay
        self.status = status
        self.body = (
            body
            if body is not None
            else json.dumps(
                {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}]}
            ).encode()
        )
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.paths: list[str] = []
        self.last_request: dict | None = None
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length))
                with server._lock:
                    server.requests += 1
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.paths.append(self.path)
                    server.last_request = request
                try:
                    time.sleep(server.delay)
                finally:
                    # Out of flight BEFORE answering: once the client has the answer it
                    # may send the next request, which must not count as an overlap.
                    with server._lock:
                        server.in_flight -= 1
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"status": "ok"}')

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_port
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> CountingCompletionServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


class HealthOnlyServer(CountingCompletionServer):
    """GET /health answers 200 at once; a completion never comes back (ranks hung)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        super().__init__()
        release = self.release
        original = self.httpd.RequestHandlerClass

        class Hung(original):  # type: ignore[misc, valid-type]
            def do_POST(self) -> None:
                release.wait(60)

        self.httpd.RequestHandlerClass = Hung

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        super().__exit__(*exc)


@contextlib.contextmanager
def silent_listener(trickle_every: float | None = None) -> Iterator[int]:
    """A TCP listener that accepts and never answers (or trickles one byte per interval)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    stop = threading.Event()
    accepted: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            accepted.append(conn)
            if trickle_every is not None:
                threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    def trickle(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.wait(trickle_every):
                conn.sendall(b"X")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()
