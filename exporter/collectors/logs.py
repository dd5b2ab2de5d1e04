"""`logs`: error signatures counted in the model services' logs, `mlx_log_errors_total`.

The only early sign of protection-domain exhaustion was a log line, so every configured
log is read incrementally: each scrape reads just the bytes added since the last one
(`mlx_medic/exporter/log_follower.py`: rotation, truncation and restarts neither lose a
line nor count one twice) and counts the signatures in them
(`mlx_medic/exporter/log_scanner.py`). A scrape reads at most
`--collector.logs.max-read-per-scrape` bytes, so a first look at a huge log catches up
over a few scrapes instead of overrunning the scrape timeout. Logs are the head node's
(the launchd service and mlx.launch run there), so a peer exports no log series for the
model.

Small scrapes (docs/metrics.md): a file's count of a signature an alert reads is always
present, 0 until a line matches (`ALERTED_SIGNATURES`, the ones the shipped rules read, and
every signature the inventory lists, so a site's own alerts get their zeros by listing
theirs); any other built-in signature's count appears with its first matching line.

    mlx_log_errors_total{signature="jaccl_protection_domain",file="/var/log/glm.err.log"} 3.0
    mlx_log_file_readable{file="/var/log/glm.err.log"} 1.0
    mlx_log_unread_bytes{file="/var/log/glm.err.log"} 0.0
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.exporter.log_follower import FileHandle, LogFollower, Opener
from mlx_medic.exporter.log_scanner import ENGINES, MAX_LINE_BYTES, LineScanner
from mlx_medic.exporter.settings import byte_count, one_of, setting
from mlx_medic.signatures import LogSignature, signatures_for

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory

log = logging.getLogger("mlx_medic.exporter.logs")

MAX_READ_PER_SCRAPE = 512 << 20  # a huge first read is spread over scrapes, within their timeout
STATE_FILE = "logs-positions.json"
# The signatures alerting-rules/mlx-medic.rules.yaml reads with increase(): a counter that
# appeared at its first count would hide that count from increase(), so these start at 0.
ALERTED_SIGNATURES = frozenset({"jaccl_protection_domain", "metal_gpu_timeout"})


@dataclass(frozen=True)
class LogsSettings:
    max_read_per_scrape: int = setting(
        MAX_READ_PER_SCRAPE,
        "bytes one scrape reads at most, over all logs; 0: no limit",
        byte_count,
        metavar="BYTES",
    )
    prefilter: str = setting(
        "auto",
        "how literal anchors are found: hyperscan, find (bytes.find), or auto"
        " (hyperscan when installed)",
        one_of(*ENGINES),
        metavar="ENGINE",
    )


class LogsCollector(Collector):
    """Incremental signature counts for each configured log file."""

    name = "logs"

    def __init__(
        self,
        files: Iterable[str | Path],
        signatures: Sequence[LogSignature],
        state_path: Path | None,
        opener: Opener = FileHandle,
        engine: str = "auto",
        max_line: int = MAX_LINE_BYTES,
        max_read_per_scrape: int | None = MAX_READ_PER_SCRAPE,
        always_present: Collection[str] = ALERTED_SIGNATURES,
    ):
        self.signatures = tuple(signatures)
        self.always_present = frozenset(always_present)
        self.max_read_per_scrape = max_read_per_scrape or None  # 0: no limit
        self.scanner = LineScanner(self.signatures, engine=engine, max_line=max_line)
        self.follower = LogFollower(
            files, [s.name for s in self.signatures], self.scanner, state_path, opener
        )
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self.follower.poll(self.max_read_per_scrape)
            errors = CounterMetricFamily(
                "mlx_log_errors",
                "Log lines matching each error signature, per service log (a line matching"
                " two signatures counts for both). Present from 0 for the signatures the"
                " shipped alerts read and those the inventory lists; any other signature's"
                " series appears with its first matching line.",
                labels=["signature", "file"],
            )
            readable = GaugeMetricFamily(
                "mlx_log_file_readable",
                "1 if the log file could be read on this scrape, 0 if missing or unreadable.",
                labels=["file"],
            )
            unread = GaugeMetricFamily(
                "mlx_log_unread_bytes",
                "Bytes of the log not read yet: a scrape reads at most"
                " --collector.logs.max-read-per-scrape bytes and catches up on later ones.",
                labels=["file"],
            )
            for path, state in self.follower.logs.items():
                for signature in self.signatures:
                    count = state.counts[signature.name]
                    if count or signature.name in self.always_present:
                        errors.add_metric([signature.name, path], count)
                readable.add_metric([path], 1.0 if state.readable else 0.0)
                unread.add_metric([path], state.unread if state.readable else 0.0)
            yield errors
            yield readable
            yield unread

    def close(self) -> None:
        with self._lock:
            self.follower.close()


def alert_ready(inventory: Inventory | None) -> frozenset[str]:
    """The signatures whose counts start at 0: the shipped alerts' and the inventory's."""
    listed = {signature.name for signature in inventory.signatures} if inventory else set()
    return ALERTED_SIGNATURES | listed


def service_logs(context: ExporterContext) -> list[Path]:
    """The log files of the models whose head (where the service runs) is this node."""
    return [p for m in context.models_here() if m.head == context.node for p in m.log_files]


@register("logs", help="count error signatures in the model services' logs", settings=LogsSettings)
def make(context: ExporterContext) -> Collector:
    settings = context.settings_for(LogsSettings)
    if service_logs(context):
        context.prepare_state_dir()  # the read positions are the login user's, 0640
    collector = LogsCollector(
        service_logs(context),
        signatures_for(context.inventory),
        context.state_dir / STATE_FILE,
        engine=settings.prefilter,
        max_read_per_scrape=settings.max_read_per_scrape,
        always_present=alert_ready(context.inventory),
    )
    if (
        collector.follower.logs
        and settings.prefilter == "auto"
        and importlib.util.find_spec("hyperscan") is None
    ):
        log.info(
            "logs: Hyperscan is not installed (no wheel for this platform); literals"
            " are found with bytes.find, about a fifth of its speed"
        )
    return collector
