"""Stale tmp dirs and mlx.launch leftovers: the disk an interrupted run leaves behind.

In the seed's cluster, partial `mlx_lm.share` dirs (`TemporaryDirectory`,
`tmpXXXXXXXX`) grew to 817 GB and 868 GB on two peers before anyone looked.
For every tmp and cache dir the inventory gives the models on this node, the
`tmp*` entries at depth one are weighed the way `du` does: allocated blocks
(`st_blocks * 512`, so a sparse file is not its apparent size), hard links
once, symlinks never followed, other filesystems never entered. An entry is
stale when no live process works in it or holds a file in it (cwd, open fds)
and nothing in its tree changed for the model's `policy.stale_tmp_age`.
On Linux GNU du does the weighing (one run per dir, `mlx_medic/platform/du.py`):
our own walk, kept for macOS and for when du fails, is about 1.5 times slower.

`mlx_launch_leftover_files` counts what mlx.launch's rank script leaves in the
launch user's temp dir: `mktemp` files named `tmp.XXXXXXXXXX` holding a pid
whose process is gone, or the MLX hostfile / RDMA-device JSON that no live rank
points at (`MLX_HOSTFILE`, `MLX_IBV_DEVICES`). Other tmp files are not counted.

Walking hundreds of gigabytes is slow, so it never happens on the scrape path:
a background thread walks every `--collector.tmpdirs.interval` seconds (default
60; `MLX_MEDIC_TMPDIRS_INTERVAL` when the flag is not given), and a scrape returns
the last completed walk at once. Without an inventory no tmp dir is scanned (only
the operator knows where `--tmpdir` points, and /tmp's `tmp*` entries belong to
everyone); the launcher leftovers are still counted in the platform's default temp dir.

    mlx_stale_tmp_dirs{dir="/Users/ai/.cache/mlx-share/glm-4_6-5b"} 212.0
    mlx_stale_tmp_bytes{dir="/Users/ai/.cache/mlx-share/glm-4_6-5b"} 8.77e+11
    mlx_stale_tmp_oldest_age_seconds{dir="/Users/ai/.cache/mlx-share/glm-4_6-5b"} 1.2e+06
    mlx_stale_tmp_walk_timestamp_seconds 1.7645e+09
    mlx_launch_leftover_files 14.0
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.core import GaugeMetricFamily, Metric

from mlx_medic.exporter.background import PeriodicWorker
from mlx_medic.exporter.collector import Collector, ExporterContext, register
from mlx_medic.exporter.settings import positive_seconds, setting
from mlx_medic.platform.du import DuError, gnu_du, run_du
from mlx_medic.platform.open_paths import PathsInUse, environment_values, paths_in_use
from mlx_medic.platform.temp_dirs import launch_temp_dirs

log = logging.getLogger("mlx_medic.exporter.tmpdirs")

DEFAULT_INTERVAL = 60.0
DEFAULT_STALE_AGE = 600.0
FIRST_SCRAPE_WAIT = 2.0  # only the first scrape after start waits, for `--once`
MAX_DEPTH = 200  # deeper trees are not walked further (and the log says so)
LEFTOVER_NAME = re.compile(r"tmp\.[A-Za-z0-9]{6,32}")
LEFTOVER_MAX_BYTES = 64 * 1024
LAUNCH_FILE_VARIABLES = ("MLX_HOSTFILE", "MLX_IBV_DEVICES")

_S_IFMT, _S_IFDIR = 0o170000, stat.S_IFDIR
_DIR_FLAGS = (
    os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)


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


@dataclass
class TreeUsage:
    """What `du -s` would count, plus the newest mtime, for one entry."""

    blocks: int = 0
    newest_mtime: float = 0.0
    skipped: int = 0


# --- weighing a tree -------------------------------------------------------------


def _account(usage: TreeUsage, st: os.stat_result, seen: set[tuple[int, int]]) -> None:
    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
        key = (st.st_dev, st.st_ino)
        if key in seen:
            return  # a hard link we already counted, as du does
        seen.add(key)
    usage.blocks += st.st_blocks
    if st.st_mtime > usage.newest_mtime:
        usage.newest_mtime = st.st_mtime


def _walk_fd(fd: int, dev: int, usage: TreeUsage, seen: set[tuple[int, int]], depth: int) -> None:
    # The hot loop of the walk: one lstat per entry and nothing else, locals only.
    stat_at = os.stat
    blocks, newest, subdirs = 0, usage.newest_mtime, []
    for name in os.listdir(fd):
        try:
            st = stat_at(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            usage.skipped += 1  # vanished or unreadable while we looked
            continue
        if st.st_mode & _S_IFMT == _S_IFDIR:
            if st.st_dev != dev:
                continue  # a mount point: another filesystem is not this dir's usage
            subdirs.append(name)
        elif st.st_nlink > 1:  # files, and symlinks as themselves (never followed)
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue  # a hard link we already counted, as du does
            seen.add(key)
        blocks += st.st_blocks
        if st.st_mtime > newest:
            newest = st.st_mtime
    usage.blocks += blocks
    usage.newest_mtime = newest
    for name in subdirs:
        if depth >= MAX_DEPTH:
            usage.skipped += 1
            continue
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)  # O_NOFOLLOW: no symlink swapped in
        except OSError:
            usage.skipped += 1
            continue
        try:
            _walk_fd(child, dev, usage, seen, depth + 1)
        except OSError:
            usage.skipped += 1
        finally:
            os.close(child)


def tree_usage(
    parent_fd: int, name: str, dev: int, seen: set[tuple[int, int]] | None = None
) -> TreeUsage | None:
    """Allocated blocks and newest mtime of `name` (in `parent_fd`) and all below it.

    None when `name` is a hard link to a file already counted: like du given
    both names, its bytes are not there twice and it is no entry of its own.
    """
    seen = set() if seen is None else seen
    usage = TreeUsage()
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) in seen:
        return None
    _account(usage, st, seen)
    if stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        try:
            _walk_fd(fd, dev, usage, seen, 1)
        finally:
            os.close(fd)
    return usage


@dataclass(frozen=True)
class Weighing:
    """The entries of one dir that could be weighed, and how many parts could not."""

    usages: dict[str, TreeUsage]
    skipped: int


class PythonWeigher:
    """Our own walk: works everywhere (macOS's du has no --time), slower than GNU du."""

    def weigh(self, dir_fd: int, dev: int, names: Sequence[str]) -> Weighing:
        seen: set[tuple[int, int]] = set()  # shared: a hard link across entries counts once
        usages: dict[str, TreeUsage] = {}
        skipped = 0
        for name in names:
            try:
                usage = tree_usage(dir_fd, name, dev, seen)
            except OSError:
                skipped += 1  # vanished or unreadable since we listed it
                continue
            if usage is not None:
                skipped += usage.skipped
                usages[name] = usage
        return Weighing(usages, skipped)


class DuWeigher:
    """GNU du weighs all of a dir's entries in one run; if du fails, our walk does it."""

    def __init__(self, du: str, fallback: PythonWeigher | None = None):
        self.du = du
        self.fallback = fallback or PythonWeigher()
        self._failing = False  # log a failure once, not on every walk

    def weigh(self, dir_fd: int, dev: int, names: Sequence[str]) -> Weighing:
        try:
            run = run_du(self.du, dir_fd, names)
        except DuError as exc:
            if not self._failing:
                log.warning("tmp walk: du failed, walking in Python instead: %s", exc)
            self._failing = True
            return self.fallback.weigh(dir_fd, dev, names)
        if self._failing:
            log.info("tmp walk: du works again")
            self._failing = False
        usages = {
            name: TreeUsage(found.bytes // 512, found.newest_mtime)
            for name, found in run.usages.items()
        }
        return Weighing(usages, run.errors)


Weigher = PythonWeigher | DuWeigher


def default_weigher() -> Weigher:
    """GNU du where it can do the job (checked once per process), else our walk."""
    du = gnu_du()
    return DuWeigher(du) if du is not None else PythonWeigher()


# --- one walk ------------------------------------------------------------------------


def scan_watched_dir(
    watched: WatchedDir, in_use: PathsInUse, now: float, weigher: Weigher | None = None
) -> DirReport:
    """The stale `tmp*` entries at depth one of `watched`."""
    label = str(watched.path)
    try:
        fd = os.open(label, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return DirReport(label, error="missing")
    except NotADirectoryError:
        return DirReport(label, error="not a directory")
    except OSError as exc:
        return DirReport(label, error=f"cannot open: {exc.strerror or exc}")
    try:
        dev = os.fstat(fd).st_dev
        busy = in_use.under(label) | in_use.under(os.path.realpath(label))
        candidates: list[str] = []
        skipped = 0
        for name in os.listdir(fd):
            if not name.startswith("tmp"):
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                skipped += 1
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                continue  # symlinks, sockets, fifos: not a leftover transfer
            if st.st_dev != dev or name in busy:
                continue
            candidates.append(name)
        weighing = (weigher or default_weigher()).weigh(fd, dev, candidates)
        skipped += weighing.skipped
        stale = blocks = 0
        oldest: float | None = None
        for name in candidates:
            usage = weighing.usages.get(name)
            if usage is None or now - usage.newest_mtime < watched.stale_age:
                continue
            stale += 1
            blocks += usage.blocks
            oldest = usage.newest_mtime if oldest is None else min(oldest, usage.newest_mtime)
        return DirReport(label, stale, blocks * 512, oldest, skipped)
    except OSError as exc:
        return DirReport(label, error=f"cannot list: {exc.strerror or exc}")
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    return pid > 0 and psutil.pid_exists(pid)


def _read_small_file(directory: int, name: str) -> bytes | None:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, dir_fd=directory)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > LEFTOVER_MAX_BYTES:
            return None
        return os.read(fd, LEFTOVER_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _looks_like_launch_json(value: object) -> bool:
    """MLX_HOSTFILE (`[["ip:port", ...], ...]`) or MLX_IBV_DEVICES (`[[null, "rdma_en5"], ...]`)."""
    if not isinstance(value, list) or not value:
        return False
    strings: list[str] = []
    for row in value:
        if not isinstance(row, list):
            return False
        for cell in row:
            if cell is None:
                continue
            cells = cell if isinstance(cell, list) else [cell]
            if not all(isinstance(c, str) for c in cells):
                return False
            strings += cells
    pattern = re.compile(r"\S+:\d{1,5}|rdma_[A-Za-z0-9_]+")
    return bool(strings) and all(pattern.fullmatch(s) for s in strings)


def classify_launch_file(content: bytes) -> str | None:
    """'pidfile', 'hostfile', or None for a file mlx.launch did not write."""
    text = content.decode("utf-8", "replace").strip()
    if re.fullmatch(r"\d{1,10}", text):
        return "pidfile"
    if text.startswith("["):
        try:
            if _looks_like_launch_json(json.loads(text)):
                return "hostfile"
        except ValueError:
            return None
    return None


@dataclass
class LeftoverCounter:
    """Counts mlx.launch's orphaned mktemp files in the launch temp dirs."""

    pid_alive: Callable[[int], bool] = _pid_alive
    referenced_paths: Callable[[], set[str]] = field(
        default=lambda: environment_values(LAUNCH_FILE_VARIABLES)
    )
    _unreadable: set[str] = field(default_factory=set)  # dirs already logged as unreadable

    def count(self, directories: Iterable[Path]) -> int | None:
        total, readable = 0, False
        hostfiles: list[str] = []
        for directory in directories:
            try:
                fd = os.open(str(directory), os.O_RDONLY | os.O_DIRECTORY)
            except OSError as exc:
                if str(directory) not in self._unreadable:
                    log.warning("launch temp dir %s skipped: %s", directory, exc.strerror or exc)
                    self._unreadable.add(str(directory))
                continue
            self._unreadable.discard(str(directory))
            readable = True
            try:
                for name in os.listdir(fd):
                    if not LEFTOVER_NAME.fullmatch(name):
                        continue
                    content = _read_small_file(fd, name)
                    kind = classify_launch_file(content) if content is not None else None
                    if kind == "pidfile":
                        if not self.pid_alive(int(content or b"0")):
                            total += 1
                    elif kind == "hostfile":
                        hostfiles.append(os.path.join(str(directory), name))
            except OSError as exc:
                log.warning("launch temp dir %s: cannot list (%s)", directory, exc)
            finally:
                os.close(fd)
        if hostfiles:
            in_use = self.referenced_paths()
            in_use |= {os.path.realpath(p) for p in in_use}
            total += sum(
                1 for p in hostfiles if p not in in_use and os.path.realpath(p) not in in_use
            )
        return total if readable else None


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
            " and unchanged for the model's stale_tmp_age." + age_note,
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
                " left in the launch user's temp dir." + age_note,
            )
            leftovers.add_metric([], result.leftovers)
            yield leftovers

    def close(self) -> None:
        self.walker.close()


def watched_dirs(context: ExporterContext) -> list[WatchedDir]:
    """Every tmp and cache dir of the models on this node; the longest stale age wins."""
    ages: dict[Path, float] = {}
    for model in context.models_here():
        for path in model.scope_dirs():
            ages[path] = max(ages.get(path, 0.0), model.policy.stale_tmp_age)
    return [WatchedDir(path, age) for path, age in ages.items()]


@dataclass(frozen=True)
class TmpDirsSettings:
    interval: float = setting(DEFAULT_INTERVAL, "seconds between background tmp walks",
                              positive_seconds, env="MLX_MEDIC_TMPDIRS_INTERVAL",
                              metavar="SECONDS")


@register("tmpdirs", help="stale tmp dirs and mlx.launch leftovers (walked in the background)",
          settings=TmpDirsSettings)
def make(context: ExporterContext) -> Collector:
    settings = context.settings_for(TmpDirsSettings)
    inventory = context.inventory
    configured = list(inventory.launch_temp_dirs) if inventory is not None else []
    walker = TmpWalker(
        watched_dirs(context),
        launch_dirs=(lambda: configured) if configured else launch_temp_dirs,
        clock=context.clock,
    )
    background = BackgroundWalker(walker.walk, settings.interval).start()
    return TmpDirsCollector(background, clock=context.clock)
