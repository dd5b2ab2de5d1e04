"""A 1 MiB webhook delivery against the real remediator: this tree's against main's, same run.

Run:
  python bench/alert_flood/run.py [--peer-ref f5c4d1f] [--rounds 1] [--deadline 45]

Each round starts, one after the other, fresh `mlx-medic remediator` processes: this tree
with its default caps, this tree with the caps off (alerts_per_delivery and
alerts_per_second 0), and the peer (`--peer-ref`, main before the caps, unpacked with `git
archive` into a temp dir and run with the same venv); each on 127.0.0.1 with its own
journal and bearer auth. Each process gets one delivery of 1 MiB (the default
max_body_bytes): either ~262,000 empty alert objects (`{}`, each invalid) or ~4,000
real-sized alerts (labels as a rule sends them; their alert name has no playbook, so each
is journaled as `unrouted` and nothing runs). A 503 is retried as Alertmanager retries it
(notify.go: exponential backoff from 0.5 s, x1.5, the same body; it reads no Retry-After)
until a 2xx or `--deadline` seconds; a server still busy then is killed. Meanwhile a
thread asks `/healthz` every 10 ms on its own connection (a poll unanswered when the server
is killed counts as the time it waited). Reported per delivery: seconds until the 2xx,
tries, alerts per second accepted (the delivery's alerts, or those journaled by the
deadline, over those seconds), `/healthz` p50/p99/max over the polls that began during the
delivery, journal bytes per alert (growth of the checkpointed journal file), and for the
real-sized delivery that every alert was journaled exactly once (`lost`, `twice`).
Goal (issue 27): `/healthz` p99 under 100 ms during a 1 MiB delivery, no alert accepted
and then lost.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from bench.alert_storm.storm import stop, wait_port  # noqa: E402
from testbed.net import free_port  # noqa: E402

BODY_BYTES = 1 << 20  # the remediator's default max_body_bytes
POLL_SECONDS = 0.01
CAPS_OFF = {"alerts_per_delivery": 0, "alerts_per_second": 0}
FIRST_BACKOFF, BACKOFF_FACTOR = 0.5, 1.5  # Alertmanager's retry (cenkalti/backoff defaults)


def envelope(alerts: list[Any]) -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": '{}:{alertname="DiskFull"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "mlx-medic",
        "groupLabels": {"alertname": "DiskFull"},
        "commonLabels": {"alertname": "DiskFull"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example:9093",
        "alerts": alerts,
    }


def real_alert(n: int) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {
            "alertname": "DiskFull",
            "severity": "warning",
            "model": "m1",
            "node": f"ai{n % 100:03}",
        },
        "annotations": {},
        "startsAt": "2026-12-04T03:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": f"{n:016x}",
    }


def fill(make: Any) -> tuple[bytes, int]:
    """As many alerts as fit in BODY_BYTES (json.dumps' default separators, as Go's are
    not: the issue's 260,000 empty alerts)."""
    per = len(json.dumps([make(0), make(1)])) // 2
    count = (BODY_BYTES - len(json.dumps(envelope([])))) // per
    while True:
        body = json.dumps(envelope([make(n) for n in range(count)])).encode()
        if len(body) <= BODY_BYTES:
            return body, count
        count -= max(1, (len(body) - BODY_BYTES) // per + 1)


@dataclass
class Poller:
    """Asks /healthz every POLL_SECONDS on its own keep-alive connection."""

    port: int
    samples: list[tuple[float, float]] = field(default_factory=list)  # (began, seconds)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        while not self.stop.is_set():
            began = time.perf_counter()
            try:
                conn.request("GET", "/healthz")
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                # the server was stopped with this poll unanswered: it waited this long
                self.samples.append((began, time.perf_counter() - began))
                return
            self.samples.append((began, time.perf_counter() - began))
            time.sleep(POLL_SECONDS)
        conn.close()

    def during(self, start: float, end: float) -> list[float]:
        return [seconds for began, seconds in self.samples if start <= began < end]


def post(port: int, token: str, body: bytes, timeout: float) -> int | None:
    """The answer's status, or None when there was none within `timeout` seconds."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    try:
        conn.request("POST", "/alerts", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    except TimeoutError:
        return None
    finally:
        conn.close()


def deliver(
    port: int, token: str, body: bytes, deadline: float
) -> tuple[list[int | None], float, float, float]:
    """Alertmanager-like: retried on 5xx with its backoff until a 2xx, for at most
    `deadline` seconds; the statuses (None: no answer by the deadline), the start and end
    (perf_counter), and the seconds spent waiting between tries."""
    statuses: list[int | None] = []
    delay, waited = FIRST_BACKOFF, 0.0
    start = time.perf_counter()
    while True:
        left = deadline - (time.perf_counter() - start)
        status = post(port, token, body, left) if left > 0 else None
        statuses.append(status)
        if status is None or status // 100 != 5:
            return statuses, start, time.perf_counter(), waited
        time.sleep(delay)
        waited += delay
        delay *= BACKOFF_FACTOR


def journal_bytes(path: Path) -> int:
    """The journal's size with its WAL written back into it (page-exact, unlike the
    size of a live WAL)."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def one_delivery(
    tree: Path, workdir: Path, body: bytes, alerts: int, settings: dict[str, Any], deadline: float
) -> dict[str, Any]:
    """A fresh remediator from `tree`, one delivery, then the journal read."""
    workdir.mkdir(parents=True)
    token = uuid.uuid4().hex
    (workdir / "token").write_text(token + "\n")
    (workdir / "inventory.yaml").write_text(
        yaml.safe_dump(
            {
                "state_dir": str(workdir / "state"),
                "nodes": {"ai001": {"ssh": "127.0.0.1"}},
                "models": {
                    "m1": {
                        "model": "/models/m1",
                        "nodes": ["ai001"],
                        "port": 1,
                        "service": {"manager": "supervisord", "label": "m1"},
                        "backends": {"ring": {"hostfile": str(workdir / "ring.json")}},
                    }
                },
            }
        )
    )
    journal = workdir / "journal.sqlite"
    (workdir / "remediator.yml").write_text(
        yaml.safe_dump(
            {
                "inventory": str(workdir / "inventory.yaml"),
                "journal": str(journal),
                "auth": {"bearer_token_file": str(workdir / "token")},
                "routing": {"playbooks": {"LLMModelDown": "recover"}},
                **settings,
            }
        )
    )
    port = free_port()
    argv = [sys.executable, "-m", "mlx_medic.cli", "remediator"]
    argv += ["--config.file", str(workdir / "remediator.yml")]
    argv += ["--web.listen-address", f"127.0.0.1:{port}"]
    with (workdir / "remediator.log").open("wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    poller = Poller(port)
    try:
        wait_port(port, proc)
        time.sleep(0.5)  # start-up done
        before = journal_bytes(journal)
        thread = threading.Thread(target=poller.run, daemon=True)
        thread.start()
        statuses, start, end, waited = deliver(port, token, body, deadline)
        poller.stop.set()
    finally:
        stop(proc, grace=5)  # the peer's loop is held until its delivery ends
    thread.join()
    with sqlite3.connect(journal) as db:
        kinds = Counter(k for (k,) in db.execute("SELECT kind FROM events"))
        unrouted = Counter(
            f for (f,) in db.execute("SELECT fingerprint FROM events WHERE kind='unrouted'")
        )
    healthz = poller.during(start, end)
    seconds = end - start
    answered = statuses[-1] is not None
    # Alerts handled: the delivery's, or (no answer by the deadline) those journaled so far.
    handled = alerts if answered else kinds["invalid"] + kinds["unrouted"]
    return {
        "alerts": alerts,
        "tries": len(statuses),
        "statuses": statuses if len(statuses) < 6 else sorted(set(statuses), key=str),
        "answered": answered,
        "seconds": round(seconds, 3),
        "waited_between_tries_s": round(waited, 3),
        "alerts_handled": handled,
        "alerts_per_s": round(handled / seconds, 1),
        "healthz_polls": len(healthz),
        "healthz_p50_ms": round(statistics.median(healthz) * 1000, 1) if healthz else None,
        "healthz_p99_ms": round(percentile(healthz, 0.99) * 1000, 1),
        "healthz_max_ms": round(max(healthz, default=float("nan")) * 1000, 1),
        "journal_bytes_per_alert": round((journal_bytes(journal) - before) / handled, 1),
        "journal_events": dict(kinds),
        "lost": sum(1 for n in range(alerts) if f"{n:016x}" not in unrouted) if unrouted else None,
        "twice": sum(1 for count in unrouted.values() if count > 1) if unrouted else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer-ref", default="f5c4d1f", help="the peer: main without the caps")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--deadline",
        type=float,
        default=45,
        help="seconds a delivery may take, retries included, before the server is stopped",
    )
    args = parser.parse_args()
    deliveries = {"empty": fill(lambda n: {}), "real": fill(real_alert)}
    workdir = Path(tempfile.mkdtemp(prefix="mlx-medic-flood-", dir="/var/tmp"))
    peer = workdir / "peer-tree"
    peer.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", args.peer_ref], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(peer)], input=archive.stdout, check=True)
    print(
        json.dumps(
            {
                "python": platform.python_version(),
                "cpus": len(os.sched_getaffinity(0)),
                "load_before": Path("/proc/loadavg").read_text().split()[:3],
                "bodies": {k: {"bytes": len(b), "alerts": n} for k, (b, n) in deliveries.items()},
            }
        )
    )
    try:
        for n in range(args.rounds):
            for name, tree, settings in (
                ("this tree", REPO, {}),
                ("this tree, caps off", REPO, CAPS_OFF),
                (f"peer {args.peer_ref}", peer, {}),
            ):
                for kind, (body, count) in deliveries.items():
                    where = workdir / f"r{n}-{len(name)}-{kind}"
                    result = one_delivery(tree, where, body, count, settings, args.deadline)
                    print(json.dumps({"round": n, "tree": name, "delivery": kind, **result}))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
