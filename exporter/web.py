"""The exporter's HTTP server: /metrics, a landing page on /, 404 elsewhere.

A thread per request on `socketserver`, HTTP/1.0, each connection closed after its
answer. Not `http.server`: that imports `http.client`, which imports `ssl` (libssl and
libcrypto) and the `email` package, about 8 MiB of resident memory the exporter never
uses (bench/busy_node). /metrics answers as client_python's `MetricsHandler` does
(mlx_medic.exporter.exposition): the format by Accept (OpenMetrics to who asks), gzip by
Accept-Encoding, only the families named by `name[]`.
"""

from __future__ import annotations

import logging
import socketserver
import time
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from prometheus_client.registry import CollectorRegistry

from mlx_medic import http_head
from mlx_medic.exporter.exposition import bake

log = logging.getLogger("mlx_medic.exporter")

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(now: float) -> str:
    """RFC 9110's IMF-fixdate, whatever the locale."""
    t = time.gmtime(now)
    return (
        f"{DAYS[t.tm_wday]}, {t.tm_mday:02d} {MONTHS[t.tm_mon - 1]} {t.tm_year}"
        f" {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


HEAD_ERRORS = {
    "line-too-long": HTTPStatus.REQUEST_URI_TOO_LONG,
    "too-many-headers": HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
    "malformed": HTTPStatus.BAD_REQUEST,
}


class BadRequest(Exception):
    def __init__(self, status: HTTPStatus) -> None:
        super().__init__(status.phrase)
        self.status = status


class MetricsServer(socketserver.ThreadingTCPServer):
    """Bound and listening once made; `registry` and `landing` are set before
    serve_forever, which serves the first request."""

    allow_reuse_address = True
    daemon_threads = True
    registry: CollectorRegistry
    landing: bytes = b""

    def __init__(self, host: str, port: int) -> None:
        super().__init__((host, port), RequestHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class RequestHandler(socketserver.StreamRequestHandler):
    server: MetricsServer
    timeout = 60  # a client that sends nothing for a minute is dropped

    def handle(self) -> None:
        request_line = ""
        try:
            request_line, method, target, headers = self.read_request()
        except BadRequest as bad:
            self.answer(request_line, bad.status, [("Content-Type", "text/plain")], b"")
            return
        except (TimeoutError, ConnectionError, EOFError):
            return
        if method != "GET":
            answer = self.error(HTTPStatus.NOT_IMPLEMENTED, f"unsupported method {method}")
        else:
            answer = self.route(target, headers)
        self.answer(request_line, *answer)

    def read_request(self) -> tuple[str, str, str, dict[str, str]]:
        """(request line, method, target, headers by lower-case name: the first of each)."""
        try:
            request_line = (
                http_head.read_line(self.rfile, "request line").decode("iso-8859-1").rstrip("\r\n")
            )
            if not request_line:
                raise EOFError
            words = request_line.split()
            if len(words) != 3 or not words[2].startswith("HTTP/"):
                raise BadRequest(HTTPStatus.BAD_REQUEST)
            return request_line, words[0], words[1], http_head.read_headers(self.rfile)
        except http_head.HeadError as exc:
            raise BadRequest(HEAD_ERRORS[exc.kind]) from None

    def route(
        self, target: str, headers: dict[str, str]
    ) -> tuple[HTTPStatus, list[tuple[str, str]], bytes]:
        url = urlsplit(target)
        if url.path == "/metrics":
            names = parse_qs(url.query).get("name[]")
            try:
                answer, body = bake(
                    self.server.registry,
                    headers.get("accept"),
                    headers.get("accept-encoding"),
                    names,
                )
            except Exception:
                log.exception("scrape failed")
                return self.error(HTTPStatus.INTERNAL_SERVER_ERROR, "scrape failed; see the log")
            return HTTPStatus.OK, answer, body
        if url.path == "/":
            landing = self.server.landing
            return HTTPStatus.OK, [("Content-Type", "text/html; charset=utf-8")], landing
        return self.error(HTTPStatus.NOT_FOUND, f"no page at {url.path}; metrics are on /metrics")

    @staticmethod
    def error(status: HTTPStatus, message: str) -> tuple[HTTPStatus, list[tuple[str, str]], bytes]:
        body = f"{status.value} {status.phrase}: {message}\n".encode()
        return status, [("Content-Type", "text/plain; charset=utf-8")], body

    def answer(
        self, request_line: str, status: HTTPStatus, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        lines = [
            f"HTTP/1.0 {status.value} {status.phrase}",
            "Server: mlx-medic",
            f"Date: {http_date(time.time())}",
            *(f"{name}: {value}" for name, value in headers),
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.wfile.write(head + body)
        except (TimeoutError, ConnectionError):
            return
        log.debug('%s "%s" %d %d', self.client_address[0], request_line, status.value, len(body))
