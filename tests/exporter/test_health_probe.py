"""The model health probe: up only after a real completion, down within the
timeout otherwise, and never two probes of one server at once."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mlx_medic.health import COMPLETIONS_PATH, ProbeResult, probe_model, probe_model_async
from testbed.net import free_port
from tests.exporter.probe_servers import (
    CountingCompletionServer,
    HealthOnlyServer,
    silent_listener,
)
from tests.exporter.real_mlx_server import mlx_lm_server

# A deadline is a correctness property here (a hung server must read down, not
# hang the caller); the slack only absorbs a loaded 2-core machine.
SLACK = 2.0


def raw_post(port: int, results: list[int]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=b'{"messages": []}',
        headers={"Content-Type": "application/json"},
    )
    results.append(connection.getresponse().status)
    connection.close()


# --- real mlx_lm.server -------------------------------------------------------


@pytest.mark.slow
def test_a_real_mlx_lm_server_reads_up_and_after_it_stops_reads_down(tiny_model, tmp_path):
    with mlx_lm_server(tiny_model, tmp_path / "server.log") as server:
        result = probe_model("127.0.0.1", server.port, timeout=30)
        assert result.up, result.reason
        assert result.conclusive and result.latency_seconds > 0
        assert "completed a 1-token request" in result.reason
        server.stop()
        result = probe_model("127.0.0.1", server.port, timeout=5)
    assert not result.up and result.conclusive
    assert "connection refused" in result.reason


# --- servers that are not serving ---------------------------------------------


def test_nothing_listening_reads_down_as_connection_refused():
    result = probe_model("127.0.0.1", free_port(), timeout=2)
    assert not result.up and result.conclusive
    assert "connection refused: nothing listens on 127.0.0.1:" in result.reason


def test_a_server_that_accepts_but_never_answers_reads_down_within_the_timeout():
    with silent_listener() as port:
        start = time.monotonic()
        result = probe_model("127.0.0.1", port, timeout=1.0)
        elapsed = time.monotonic() - start
    assert not result.up and result.conclusive
    assert "no complete answer" in result.reason and "within 1s" in result.reason
    assert elapsed < 1.0 + SLACK


def test_a_server_whose_accept_queue_is_full_reads_down_within_the_timeout():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepts: one queued connection fills it
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(2):
                filler = socket.socket()
                filler.settimeout(0.3)
                with contextlib.suppress(OSError):
                    filler.connect(("127.0.0.1", port))
                fillers.append(filler)
            start = time.monotonic()
            result = probe_model("127.0.0.1", port, timeout=1.0)
            elapsed = time.monotonic() - start
        finally:
            for filler in fillers:
                filler.close()
    assert not result.up and result.conclusive
    assert "within 1s" in result.reason
    assert elapsed < 1.0 + SLACK


def test_a_server_that_trickles_bytes_cannot_stretch_the_deadline():
    # Each byte arrives before the socket timeout; only an overall deadline stops this.
    with silent_listener(trickle_every=0.2) as port:
        start = time.monotonic()
        result = probe_model("127.0.0.1", port, timeout=1.5)
        elapsed = time.monotonic() - start
    assert not result.up
    assert "within 1.5s" in result.reason
    assert elapsed < 1.5 + SLACK


def test_health_answering_200_is_not_proof_the_model_serves():
    with HealthOnlyServer() as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 200
        connection.close()
        result = probe_model("127.0.0.1", server.port, timeout=1.0)
    assert not result.up
    assert "no complete answer from POST /v1/chat/completions" in result.reason


@pytest.mark.parametrize(
    "status, body, reason",
    [
        (503, b'{"error": "unavailable"}', "HTTP 503 from POST /v1/chat/completions"),
        (200, b"<html>proxy login</html>", "answered 200 but not with JSON"),
        (200, b'{"choices": []}', "without a completion"),
        (200, b'["not", "an", "object"]', "without a completion"),
    ],
)
def test_an_answer_that_is_not_a_completion_reads_down_and_says_why(status, body, reason):
    with CountingCompletionServer(status=status, body=body) as server:
        result = probe_model("127.0.0.1", server.port, timeout=5)
    assert not result.up and result.conclusive
    assert reason in result.reason


# --- what the probe sends -----------------------------------------------------


def test_the_probe_asks_for_one_token_and_names_no_model():
    with CountingCompletionServer() as server:
        assert probe_model("127.0.0.1", server.port, timeout=5).up
        request = server.last_request
    assert request is not None
    assert request["max_tokens"] == 1 and request["stream"] is False
    assert "model" not in request  # mlx_lm.server would try to load a model by that name
    assert request["messages"] == [{"role": "user", "content": "ping"}]


def test_the_completions_path_sends_a_prompt():
    with CountingCompletionServer() as server:
        assert probe_model("127.0.0.1", server.port, timeout=5, path=COMPLETIONS_PATH).up
        assert server.paths == ["/v1/completions"]
        assert server.last_request is not None and server.last_request["prompt"] == "ping"


@pytest.mark.parametrize(
    "host, port, timeout, path, problem",
    [
        ("127.0.0.1", 0, 1.0, "/v1/chat/completions", "port 0 is not a TCP port"),
        ("127.0.0.1", 70000, 1.0, "/v1/chat/completions", "port 70000"),
        ("127.0.0.1", True, 1.0, "/v1/chat/completions", "not a TCP port"),
        ("", 8080, 1.0, "/v1/chat/completions", "host '' is not"),
        ("127.0.0.1/evil", 8080, 1.0, "/v1/chat/completions", "not a host"),
        ("127.0.0.1", 8080, 0, "/v1/chat/completions", "timeout 0 must be a positive"),
        ("127.0.0.1", 8080, 1.0, "/health", "path '/health' is not one of"),
    ],
)
def test_bad_probe_targets_are_refused_with_an_error_that_names_them(
    host, port, timeout, path, problem
):
    with pytest.raises(ValueError, match=problem):
        probe_model(host, port, timeout=timeout, path=path)


# --- never two probes at once -------------------------------------------------


def test_the_counting_server_does_see_overlap_when_requests_race():
    # The control for the tests below: unserialized requests do overlap.
    with CountingCompletionServer(delay=0.3) as server:
        statuses: list[int] = []
        threads = [
            threading.Thread(target=raw_post, args=(server.port, statuses)) for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert statuses == [200, 200]
    assert server.max_in_flight == 2


def test_probes_racing_from_many_threads_never_overlap():
    with CountingCompletionServer(delay=0.2) as server:
        results: list[ProbeResult] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    probe_model("127.0.0.1", server.port, timeout=5, lock_wait=30)
                )
            )
            for _ in range(5)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert len(results) == 5 and all(r.up for r in results)
    assert server.requests == 5
    assert server.max_in_flight == 1


async def test_async_probes_and_sync_probes_share_one_lock():
    with CountingCompletionServer(delay=0.2) as server:
        sync_results: list[ProbeResult] = []
        thread = threading.Thread(
            target=lambda: sync_results.extend(
                probe_model("127.0.0.1", server.port, timeout=5, lock_wait=30) for _ in range(2)
            )
        )
        thread.start()
        async_results = await asyncio.gather(
            *(
                probe_model_async("127.0.0.1", server.port, timeout=5, lock_wait=30)
                for _ in range(3)
            )
        )
        await asyncio.to_thread(thread.join, 30)
    assert all(r.up for r in [*sync_results, *async_results])
    assert server.requests == 5
    assert server.max_in_flight == 1


def test_probes_of_different_servers_do_not_wait_for_each_other():
    with silent_listener() as hung_port, CountingCompletionServer() as healthy:
        hung = threading.Thread(
            target=probe_model, args=("127.0.0.1", hung_port), kwargs={"timeout": 3.0}
        )
        hung.start()
        time.sleep(0.2)
        result = probe_model("127.0.0.1", healthy.port, timeout=5, lock_wait=0.0)
        hung.join(10)
    assert result.up and result.conclusive


def test_a_probe_that_cannot_get_the_lock_is_inconclusive_not_down():
    with silent_listener() as port:
        holder = threading.Thread(
            target=probe_model, args=("127.0.0.1", port), kwargs={"timeout": 2.0}
        )
        holder.start()
        time.sleep(0.3)
        result = probe_model("127.0.0.1", port, timeout=1.0, lock_wait=0.1)
        holder.join(10)
    assert not result.up and not result.conclusive
    assert "not probed: another probe of 127.0.0.1:" in result.reason


PROBE_IN_CHILD = """
import json, sys
from pathlib import Path
from mlx_medic.health import probe_model
port, lock_dir, count = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
ups = [probe_model("127.0.0.1", port, timeout=5, lock_wait=60, lock_dir=lock_dir).up
       for _ in range(count)]
print(json.dumps(ups))
"""


@pytest.mark.slow
def test_a_shared_lock_dir_keeps_probes_from_two_processes_apart(tmp_path: Path):
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    with CountingCompletionServer(delay=0.15) as server:
        child = subprocess.Popen(
            [sys.executable, "-c", PROBE_IN_CHILD, str(server.port), str(lock_dir), "6"],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
        )
        try:
            mine = [
                probe_model("127.0.0.1", server.port, timeout=5, lock_wait=60, lock_dir=lock_dir).up
                for _ in range(6)
            ]
            out, _ = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert all(mine) and all(json.loads(out))
    assert server.requests == 12
    assert server.max_in_flight == 1


# --- how the answer is framed (the probe's own HTTP client) ----------------------------

COMPLETION = b'{"choices": [{"text": "x"}]}'


@contextlib.contextmanager
def answering(reply: bytes):
    """A server that reads one request (head and Content-Length body), sends `reply`
    as is, and closes; the port, then the request it read."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    request: list[bytes] = []

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += connection.recv(65536)
            request.append(head + b"\r\n\r\n" + body)
            connection.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], request
    finally:
        thread.join(timeout=10)
        server.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(COMPLETION) + COMPLETION,
        b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + COMPLETION,
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\n"
        + COMPLETION[:5]
        + b"\r\n"
        + b"%x;x=y\r\n" % (len(COMPLETION) - 5)
        + COMPLETION[5:]
        + b"\r\n0\r\n\r\n",
    ],
    ids=["content-length", "until-close", "continue-then-chunked"],
)
def test_a_completion_reads_up_however_the_answer_is_framed(reply: bytes):
    with answering(reply) as (port, request):
        result = probe_model("127.0.0.1", port, timeout=5)
    assert result.up, result.reason
    head = request[0].split(b"\r\n\r\n")[0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}" in head and "Connection: close" in head


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (b"", "closed the connection without an answer"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not an HTTP status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", "ended after 2 of 100 bytes"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    ],
)
def test_an_answer_that_is_not_http_reads_down_and_says_why(reply: bytes, reason: str):
    with answering(reply) as (port, _request):
        result = probe_model("127.0.0.1", port, timeout=5)
    assert not result.up and result.conclusive and not result.timed_out
    assert "POST /v1/chat/completions failed: ProtocolError:" in result.reason
    assert reason in result.reason
