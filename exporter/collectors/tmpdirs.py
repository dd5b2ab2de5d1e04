"""Stale tmp dirs and mlx.launch leftovers: the disk an interrupted run leaves behind.

In the seed's cluster, partial `mlx_lm.share` dirs (`TemporaryDirectory`,
`tmpXXXXXXXX`) grew to 817 GB and 868 GB on two peers before anyone looked.
For every tmp and cache dir the inventory gives the models on this node (a dir
two models share is one dir), this collector counts the stale `tmp*` entries and
their bytes as `du` counts them, by the rule the clean step removes them with
(`mlx_medic.tmp_rules`: no live process works in or holds a file in the entry,
and nothing in its tree changed for the `policy.stale_tmp_age` of every model that
names the dir; symlinks never followed, other filesystems never entered). On Linux
GNU du does the weighing (one run per dir, `mlx_medic/platform/du.py`): our own walk
(`mlx_medic/platform/weighers.py`), kept for macOS and for when du fails, is about
1.5 times slower.

`mlx_launch_leftover_files` counts what mlx.launch's rank script leaves in the
temp dir of the user it runs as (each model's `service.user`: an exporter running
as root asks for that user's dir, not its own), by the same module's rule:
`mktemp` files named `tmp.XXXXXXXXXX` holding a pid whose process is gone, or the
MLX hostfile / RDMA-device JSON that no live rank points at (`MLX_HOSTFILE`,
`MLX_IBV_DEVICES`). Other tmp files are not counted.

Walking hundreds of gigabytes is slow, so it never happens on the scrape path:
a background thread walks every `--collector.tmpdirs.interval` seconds (default
60; `MLX_MEDIC_TMPDIRS_INTERVAL` when the flag is not given), and a scrape returns
the last completed walk at once. Without an inventory no tmp dir is scanned (only
the operator knows where `--tmpdir` points, and /tmp's `tmp*` entries belong to
everyone); the launcher leftovers are still counted, in the exporter's own user's
temp dir.

    mlx_stale_tmp_dirs{dir="/Users/ai/.cache/mlx-share/glm-4_6-5b"} 212.0
    mlx_stale_tmp_bytes{dir="/Users/ai/.cache/mlx-share/glm-4_6-5b"} 8.77e+11
    mlx_stale_tmp_oldest_age_seconds{dir="/Users/ai/.cache/mlx-share/glm-4_6-5b"} 1.2e+06
    mlx_stale_tmp_walk_timestamp_seconds 1.7645e+09
    mlx_launch_leftover_files 14.0
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from mlx_medic.exporter.background import PeriodicWorker
from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.exporter.settings import positive_seconds, setting
from mlx_medic.platform.open_paths import PathsInUse, paths_in_use
from mlx_medic.platform.temp_dirs import user_temp_dirs
from mlx_medic.platform.weighers import Weigher, default_weigher
from mlx_medic.tmp_rules import launcher_leftovers, scope_dirs, stale_entries

log = logging.getLogger("mlx_medic.exporter.tmpdirs")

DEFAULT_INTERVAL = 60.0
DEFAULT_STALE_AGE = 600.0
FIRST_SCRAPE_WAIT = 2.0  # only the first scrape after start waits, for `--once`


@dataclass(frozen=True)
class WatchedDir:
    path: Path
    stale_age: float = DEFAULT_STALE_AGE


@dataclass(frozen=True)
class DirReport:
    """One watched dir after a walk; `error` set means it could not be read at all."""

    path: str
    stale_entries: int = 0
    stale_bytes: int = 0
    oldest_mtime: float | None = None  # the stalest entry's newest modification
    skipped: int = 0  # entries we could not weigh fully (vanished, unreadable, too deep)
    error: str | None = None


@dataclass(frozen=True)
class WalkResult:
    finished_at: float
    duration: float
    dirs: tuple[DirReport, ...]
    leftovers: int | None  # None: no launch temp dir could be read


# --- one walk ------------------------------------------------------------------------


def scan_watched_dir(
    watched: WatchedDir, in_use: PathsInUse, now: float, weigher: Weigher | None = None
) -> DirReport:
    """The stale `tmp*` entries at depth one of `watched`, summed for the metrics."""
    scan = stale_entries(watched.path, now, watched.stale_age, in_use, weigher)
    if scan.error is not None:
        return DirReport(str(watched.path), error=scan.error)
    return DirReport(
        str(watched.path),
        len(scan.entries),
        sum(entry.bytes for entry in scan.entries),
        min((entry.newest_mtime for entry in scan.entries), default=None),
        scan.skipped,
    )


class LeftoverCounter:
    """Counts mlx.launch's orphaned mktemp files in the launch temp dirs; logs an
    unreadable dir once (until it is readable again)."""

    def __init__(self) -> None:
        self._unreadable: set[str] = set()  # dirs already logged as unreadable

    def count(self, directories: Iterable[Path]) -> int | None:
        scan = launcher_leftovers(directories)
        for directory, why in scan.unreadable:
            if str(directory) not in self._unreadable:
                log.warning("launch temp dir %s skipped: %s", directory, why)
                self._unreadable.add(str(directory))
        for directory in scan.read:
            self._unreadable.discard(str(directory))
        return len(scan.files) if scan.read else None


class TmpWalker:
    """One complete walk: every watched dir, then the launcher's temp dirs."""

    def __init__(
        self,
        watched: Sequence[WatchedDir],
        launch_dirs: Callable[[], Sequence[Path]],
        clock: Callable[[], float] = time.time,
        in_use: Callable[[], PathsInUse] = paths_in_use,
        leftovers: LeftoverCounter | None = None,
        weigher: Weigher | None = None,
    ):
        self.watched = list(watched)
        self.weigher = weigher or default_weigher()
        self._launch_dirs_source = launch_dirs
        self._launch_dirs: list[Path] | None = None
        self.clock = clock
        self.in_use = in_use
        self.leftovers = leftovers or LeftoverCounter()
        self._reported: dict[str, str | None] = {}

    def walk(self) -> WalkResult:
        started = time.monotonic()
        using = self.in_use() if self.watched else PathsInUse()
        if using.unreadable:
            log.debug("%d processes could not be inspected for open paths", using.unreadable)
        now = self.clock()
        reports = tuple(scan_watched_dir(w, using, now, self.weigher) for w in self.watched)
        for report in reports:
            self._log_change(report)
        if self._launch_dirs is None:
            self._launch_dirs = list(self._launch_dirs_source())
        leftovers = self.leftovers.count(self._launch_dirs)
        return WalkResult(self.clock(), time.monotonic() - started, reports, leftovers)

    def _log_change(self, report: DirReport) -> None:
        before = self._reported.get(report.path)
        if report.error != before:
            if report.error:
                log.warning("tmp dir %s skipped: %s", report.path, report.error)
            elif report.path in self._reported:
                log.info("tmp dir %s readable again", report.path)
        self._reported[report.path] = report.error


class BackgroundWalker:
    """Runs a walk every `interval` seconds in a daemon thread; keeps the last result."""

    def __init__(self, walk: Callable[[], WalkResult], interval: float = DEFAULT_INTERVAL):
        self.walk = walk
        self.latest: WalkResult | None = None
        self.last_error: str | None = None
        self._worker = PeriodicWorker("tmp walk", interval, self._walk_once)
        self.interval = interval

    def start(self) -> BackgroundWalker:
        self._worker.start()
        return self

    def _walk_once(self) -> None:
        try:
            self.latest = self.walk()
            self.last_error = None
        except Exception as exc:
            log.exception("tmp walk failed")
            self.last_error = f"{type(exc).__name__}: {exc}"

    def wait_first(self, timeout: float) -> None:
        self._worker.wait_first(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._worker.close(timeout)


class TmpDirsCollector(Collector):
    """Reports the background walker's last result; never walks on the scrape path."""

    name = "tmpdirs"

    def __init__(
        self,
        walker: BackgroundWalker,
        clock: Callable[[], float] = time.time,
        first_scrape_wait: float = FIRST_SCRAPE_WAIT,
    ):
        self.walker = walker
        self.clock = clock
        self._first_wait = first_scrape_wait

    def collect(self) -> Iterator[Metric]:
        if self._first_wait > 0:
            self.walker.wait_first(self._first_wait)
            self._first_wait = 0
        result = self.walker.latest
        if self.walker.last_error is not None:
            raise RuntimeError(f"the last tmp walk failed: {self.walker.last_error}")
        yield from self._families(result)

    def _families(self, result: WalkResult | None) -> Iterator[Metric]:
        age_note = (
            " From the last background walk (every --collector.tmpdirs.interval seconds), so"
            " as old as mlx_stale_tmp_walk_timestamp_seconds says."
        )
        dirs = GaugeMetricFamily(
            "mlx_stale_tmp_dirs",
            "Stale tmp* entries (dirs or files) at depth one of the dir: unused by any process"
            " and unchanged for the stale_tmp_age of every model that names the dir (in"
            " tmp_dirs or cache_dirs; a shared dir is one series)." + age_note,
            labels=["dir"],
        )
        size = GaugeMetricFamily(
            "mlx_stale_tmp_bytes",
            "Allocated bytes (what du counts) of the stale tmp* entries." + age_note,
            labels=["dir"],
        )
        oldest = GaugeMetricFamily(
            "mlx_stale_tmp_oldest_age_seconds",
            "Seconds since anything changed in the stalest tmp* entry (0: none stale)." + age_note,
            labels=["dir"],
        )
        readable = GaugeMetricFamily(
            "mlx_stale_tmp_dir_readable",
            "1 if the last walk could read the configured dir, 0 if missing or unreadable.",
            labels=["dir"],
        )
        walked_at = GaugeMetricFamily(
            "mlx_stale_tmp_walk_timestamp_seconds",
            "Unix time the last completed tmp walk finished (0: none yet).",
        )
        took = GaugeMetricFamily(
            "mlx_stale_tmp_walk_duration_seconds", "How long the last completed tmp walk took."
        )
        walked_at.add_metric([], result.finished_at if result else 0.0)
        yield walked_at
        if result is None:
            return
        took.add_metric([], result.duration)
        now = self.clock()
        for report in result.dirs:
            readable.add_metric([report.path], 0.0 if report.error else 1.0)
            if report.error:
                continue  # absent, never a fake zero
            dirs.add_metric([report.path], report.stale_entries)
            size.add_metric([report.path], report.stale_bytes)
            age = 0.0 if report.oldest_mtime is None else max(0.0, now - report.oldest_mtime)
            oldest.add_metric([report.path], age)
        yield from (took, dirs, size, oldest, readable)
        if result.leftovers is not None:
            leftovers = GaugeMetricFamily(
                "mlx_launch_leftover_files",
                "mlx.launch pid files (process gone) and hostfiles (no live rank uses them)"
                " left in the temp dir of the user mlx.launch runs as (service.user)." + age_note,
            )
            leftovers.add_metric([], result.leftovers)
            yield leftovers

    def close(self) -> None:
        self.walker.close()


def watched_dirs(context: ExporterContext) -> list[WatchedDir]:
    """Every tmp and cache dir of the models on this node, a shared one once, with the
    longest stale age of the models sharing it (`tmp_rules.scope_dirs`)."""
    return [WatchedDir(d.path, d.stale_age) for d in scope_dirs(context.models_here())]


def launch_dirs_of(context: ExporterContext) -> Callable[[], list[Path]]:
    """Where to count launcher leftovers: the inventory's `launch_temp_dirs`, else the temp
    dir of each service user of this node's models (`service.user`; unset: ours). Asked
    for on the first walk, off the scrape path (on macOS it runs getconf)."""
    configured = list(context.inventory.launch_temp_dirs) if context.inventory else []
    if configured:
        return lambda: configured
    users = [model.service.user for model in context.models_here()] or [None]
    return lambda: user_temp_dirs(users)


@dataclass(frozen=True)
class TmpDirsSettings:
    interval: float = setting(
        DEFAULT_INTERVAL,
        "seconds between background tmp walks",
        positive_seconds,
        env="MLX_MEDIC_TMPDIRS_INTERVAL",
        metavar="SECONDS",
    )


@register(
    "tmpdirs",
    help="stale tmp dirs and mlx.launch leftovers (walked in the background)",
    settings=TmpDirsSettings,
)
def make(context: ExporterContext) -> Collector:
    settings = context.settings_for(TmpDirsSettings)
    walker = TmpWalker(watched_dirs(context), launch_dirs_of(context), clock=context.clock)
    background = BackgroundWalker(walker.walk, settings.interval).start()
    return TmpDirsCollector(background, clock=context.clock)
