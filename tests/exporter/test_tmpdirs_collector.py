"""The tmpdirs collector: stale tmp* entries weighed like du, walked off the scrape path,
and mlx.launch's leftover files."""

from __future__ import annotations

import json
import logging
import math
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mlx_medic.exporter.collector import ExporterContext, ScrapeCollector, sample_value
from mlx_medic.exporter.collectors import tmpdirs
from mlx_medic.exporter.collectors.tmpdirs import (
    BackgroundWalker,
    DirReport,
    LeftoverCounter,
    TmpDirsCollector,
    TmpWalker,
    WalkResult,
    WatchedDir,
    scan_watched_dir,
)
from mlx_medic.inventory.load import parse_inventory
from mlx_medic.platform.commands import CommandError, CompletedCommand, as_user, output_of
from mlx_medic.platform.du import DuError, gnu_du, parse_du_output, probe_du
from mlx_medic.platform.open_paths import PathsInUse, paths_in_use, psutil_paths_in_use
from mlx_medic.platform.temp_dirs import (
    launch_temp_dirs,
    parse_darwin_user_temp_dir,
    user_temp_dirs,
)
from mlx_medic.platform.weighers import DuWeigher, PythonWeigher, default_weigher
from mlx_medic.tmp_rules import classify_launch_file, launcher_leftovers, stale_entries
from tests.tools import require_root, require_tool

FIXTURES = Path(__file__).parent.parent / "fixtures" / "macos"
OLD = time.time() - 86400  # a day ago: stale under the default 600 s
NOBODY_IN_USE = PathsInUse()


def age_tree(root: Path, when: float = OLD) -> None:
    """Set every mtime in the tree (not following symlinks) to `when`."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + dirnames:
            os.utime(os.path.join(dirpath, name), (when, when), follow_symlinks=False)
    os.utime(root, (when, when), follow_symlinks=False)


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def du_kib(*paths: Path) -> int:
    """The real du's total for the paths, in KiB (hard links counted once across them)."""
    du = require_tool("du")
    out = subprocess.run(
        [du, "-skc", *map(str, paths)], check=True, capture_output=True, text=True
    ).stdout
    return int(out.strip().splitlines()[-1].split()[0])


@pytest.fixture
def share_dir(tmp_path: Path) -> Path:
    """A cache dir the way mlx_lm.share leaves it: partial tmp dirs beside real content."""
    root = tmp_path / "mlx-share"
    for n in range(3):
        entry = root / f"tmp{n}abcdefg"
        write(entry / "blobs" / "sha256-a", 100_000 + n * 7_777)
        write(entry / "blobs" / "sha256-b", 3_000)
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text("deadbeef\n")
        (entry / "snapshots" / "deadbeef").mkdir(parents=True)
    write(root / "tmpfile_partial", 12_345)  # a stale tmp* file counts too
    write(root / "models--mlx-community--GLM" / "blob", 50_000)  # not tmp*: never counted
    # a hard link inside one entry and one across two entries: counted once, like du
    os.link(root / "tmp0abcdefg" / "blobs" / "sha256-a", root / "tmp0abcdefg" / "again")
    os.link(root / "tmp1abcdefg" / "blobs" / "sha256-a", root / "tmp2abcdefg" / "shared")
    age_tree(root)
    return root


@pytest.fixture(params=["gnu-du", "python"])
def weigher(request) -> DuWeigher | PythonWeigher:
    """Both ways of weighing: GNU du (Linux's default) and our walk (macOS, du failing)."""
    if request.param == "python":
        return PythonWeigher()
    require_tool("du")
    du = gnu_du()
    assert du is not None, "this host's du cannot weigh (see the log for why)"
    return DuWeigher(du)


def tmp_entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith("tmp"))


def dead_pid() -> int:
    """A pid that just ended (reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_stale_bytes_agree_with_du_on_the_same_tree(share_dir, weigher):
    report = scan_watched_dir(WatchedDir(share_dir), NOBODY_IN_USE, time.time(), weigher)
    assert report.error is None
    assert report.stale_entries == 4
    assert math.ceil(report.stale_bytes / 1024) == du_kib(*tmp_entries(share_dir))
    assert report.oldest_mtime == pytest.approx(OLD, abs=1)


def test_gnu_du_and_our_walk_agree_on_odd_names_and_hard_links(share_dir):
    require_tool("du")
    du = gnu_du()
    assert du is not None and isinstance(default_weigher(), DuWeigher)  # Linux's default
    write(share_dir / "tmp with\ttab and\nnewline" / "blob", 9_000)
    os.link(share_dir / "tmpfile_partial", share_dir / "tmpfile_again")  # an entry twice
    os.link(share_dir / "tmp0abcdefg" / "blobs" / "sha256-b", share_dir / "tmplinked_file")
    age_tree(share_dir)
    now = time.time()
    by_du = scan_watched_dir(WatchedDir(share_dir), NOBODY_IN_USE, now, DuWeigher(du))
    by_python = scan_watched_dir(WatchedDir(share_dir), NOBODY_IN_USE, now, PythonWeigher())
    assert (by_du.error, by_du.skipped) == (by_python.error, by_python.skipped) == (None, 0)
    assert by_du.stale_entries == by_python.stale_entries >= 5
    assert by_du.stale_bytes == by_python.stale_bytes
    assert math.ceil(by_du.stale_bytes / 1024) == du_kib(*tmp_entries(share_dir))
    assert by_du.oldest_mtime == pytest.approx(by_python.oldest_mtime, abs=1)  # du: whole seconds


def fake_du(tmp_path: Path, script: str | None) -> str:
    """A `du` that misbehaves as `script` says (None: not installed at all)."""
    path = tmp_path / "bin" / "du"
    if script is not None:
        path.parent.mkdir()
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    "script",
    [
        "exit 2",  # du fails
        "echo 'du: something broke' >&2; exit 1",  # fails with no record at all
        "printf 'not a du record'",  # prints what we cannot parse
        "kill -9 $$",  # killed
        None,  # gone since the capability check
    ],
)
def test_a_du_that_fails_hands_the_dir_to_our_walk_with_one_log_line(
    share_dir, tmp_path, caplog, script
):
    weigher = DuWeigher(fake_du(tmp_path, script))
    now = time.time()
    expected = scan_watched_dir(WatchedDir(share_dir), NOBODY_IN_USE, now, PythonWeigher())
    with caplog.at_level(logging.WARNING):
        first = scan_watched_dir(WatchedDir(share_dir), NOBODY_IN_USE, now, weigher)
        second = scan_watched_dir(WatchedDir(share_dir), NOBODY_IN_USE, now, weigher)
    assert first == expected == second
    assert expected.stale_entries == 4
    assert caplog.text.count("du failed, walking in Python instead") == 1


def test_the_capability_check_accepts_gnu_du_and_names_why_another_du_will_not_do(tmp_path):
    du = require_tool("du")
    assert probe_du(du) is None
    no_time_option = fake_du(tmp_path, "echo \"du: unknown option '$4'\" >&2; exit 1")
    assert "unknown option '--time'" in (probe_du(no_time_option) or "")


def test_on_macos_or_without_du_the_walk_is_ours_and_the_log_says_why(
    tmp_path, monkeypatch, caplog
):
    check = gnu_du.__wrapped__  # the once-per-process check, uncached
    with caplog.at_level(logging.INFO):
        monkeypatch.setattr(sys, "platform", "darwin")
        assert check() is None
        monkeypatch.setattr(sys, "platform", "linux")
        monkeypatch.setenv("PATH", str(tmp_path))  # nothing named du in it
        assert check() is None
    assert "tmp walk: in Python (darwin's du has no --time)" in caplog.text
    assert "tmp walk: in Python (du is not installed)" in caplog.text


def test_du_records_parse_any_name_and_a_bad_record_is_quoted():
    out = b"4096\t1700000000\t./tmp a\tb\nc\x0012288\t1600000000\t./tmp\xff\x00"
    usages = parse_du_output(out)
    assert usages["tmp a\tb\nc"].bytes == 4096
    assert usages["tmp a\tb\nc"].newest_mtime == 1700000000
    assert usages[os.fsdecode(b"tmp\xff")].bytes == 12288
    with pytest.raises(DuError, match=r"cannot parse: b.4\.0K"):
        parse_du_output(b"4.0K\t1700000000\t./tmpx\x00")


def test_a_sparse_file_counts_by_allocation_not_apparent_size(tmp_path, weigher):
    root = tmp_path / "cache"
    entry = root / "tmpsparse01"
    entry.mkdir(parents=True)
    with open(entry / "model.safetensors", "wb") as f:
        f.truncate(800 * 2**30)  # 800 GiB apparent
        f.write(b"x" * 4096)
    age_tree(root)
    try:
        report = scan_watched_dir(WatchedDir(root), NOBODY_IN_USE, time.time(), weigher)
        assert report.stale_bytes < 2**20
        assert math.ceil(report.stale_bytes / 1024) == du_kib(entry)
    finally:
        (entry / "model.safetensors").unlink()


def test_symlinks_pointing_outside_are_never_followed(share_dir, tmp_path, weigher):
    outside = tmp_path / "outside"
    write(outside / "huge", 2_000_000)
    os.symlink(outside, share_dir / "tmp0abcdefg" / "link-to-outside")
    os.symlink(outside / "huge", share_dir / "tmp1abcdefg" / "file-link")
    os.symlink(outside, share_dir / "tmpTopLevelLink")  # a tmp* entry that is a symlink
    age_tree(share_dir)
    report = scan_watched_dir(WatchedDir(share_dir), NOBODY_IN_USE, time.time(), weigher)
    assert report.stale_entries == 4  # the symlinked entry is not an entry to weigh
    assert report.stale_bytes < 2_000_000
    assert math.ceil(report.stale_bytes / 1024) == du_kib(
        *(p for p in tmp_entries(share_dir) if not p.is_symlink())
    )


def test_a_filesystem_mounted_inside_an_entry_is_not_entered(share_dir, weigher):
    """A tmpfs mounted in a tmp dir, in a private mount namespace the test creates."""
    require_root()
    unshare = require_tool("unshare")
    mount = require_tool("mount")
    inner = share_dir / "tmp0abcdefg" / "mnt"
    inner.mkdir()
    age_tree(share_dir)
    weigher_code = (
        f"weighers.DuWeigher({weigher.du!r})"
        if isinstance(weigher, DuWeigher)
        else "weighers.PythonWeigher()"
    )
    script = (
        "import json, math, subprocess, sys, time\n"
        "from mlx_medic.exporter.collectors import tmpdirs\n"
        "from mlx_medic.platform import weighers\n"
        "from mlx_medic.platform.open_paths import PathsInUse\n"
        "open(sys.argv[2] + '/big', 'wb').write(b'x' * 5_000_000)\n"
        f"w = {weigher_code}\n"
        "r = tmpdirs.scan_watched_dir(tmpdirs.WatchedDir(sys.argv[1]), PathsInUse(),"
        " time.time() + 86400, w)\n"
        "du = subprocess.run(['du', '-skxc', *sys.argv[3:]], capture_output=True, text=True)\n"
        "print(json.dumps([math.ceil(r.stale_bytes / 1024),"
        " int(du.stdout.splitlines()[-1].split()[0])]))\n"
    )
    entries = [str(p) for p in tmp_entries(share_dir)]
    done = subprocess.run(
        [
            unshare,
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'{mount} -t tmpfs tmpfs "$2" && s="$1" i="$2" d="$3" && shift 3 &&'
            ' exec "$0" -c "$s" "$d" "$i" "$@"',
            sys.executable,
            script,
            str(inner),
            str(share_dir),
            *entries,
        ],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ours_kib, du_kib = json.loads(done.stdout)
    assert ours_kib == du_kib
    assert ours_kib < 5_000


def test_an_entry_changed_recently_anywhere_in_its_tree_is_not_stale(share_dir, weigher):
    deep = share_dir / "tmp1abcdefg" / "blobs" / "sha256-b"
    os.utime(deep, None)  # a transfer still writing deep inside an old-looking dir
    report = scan_watched_dir(
        WatchedDir(share_dir, stale_age=600), NOBODY_IN_USE, time.time(), weigher
    )
    assert report.stale_entries == 3
    younger = scan_watched_dir(
        WatchedDir(share_dir, stale_age=2 * 86400), NOBODY_IN_USE, time.time(), weigher
    )
    assert younger.stale_entries == 0


@pytest.fixture
def processes_using(share_dir) -> Iterator[list[subprocess.Popen]]:
    """Real children: one working in tmp0, one holding a file open in tmp1, one a dir fd in tmp2."""
    holder = (
        "import os, sys, time\n"
        "f = open(sys.argv[1], 'rb') if os.path.isfile(sys.argv[1]) else None\n"
        "d = os.open(sys.argv[1], os.O_RDONLY) if f is None else None\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    children = [
        subprocess.Popen(["sleep", "120"], cwd=share_dir / "tmp0abcdefg"),
        subprocess.Popen(
            [sys.executable, "-c", holder, str(share_dir / "tmp1abcdefg" / "blobs" / "sha256-b")],
            stdout=subprocess.PIPE,
            text=True,
        ),
        subprocess.Popen(
            [sys.executable, "-c", holder, str(share_dir / "tmp2abcdefg" / "refs")],
            stdout=subprocess.PIPE,
            text=True,
        ),
    ]
    try:
        for child in children[1:]:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield children
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_an_entry_a_live_process_works_in_or_holds_open_is_not_stale(
    share_dir, processes_using, weigher
):
    in_use = paths_in_use()
    assert in_use.under(str(share_dir)) >= {"tmp0abcdefg", "tmp1abcdefg", "tmp2abcdefg"}
    report = scan_watched_dir(WatchedDir(share_dir), in_use, time.time(), weigher)
    assert report.stale_entries == 1  # only tmpfile_partial is left
    assert report.stale_bytes == (share_dir / "tmpfile_partial").stat().st_blocks * 512


def test_the_macos_seam_collects_cwd_and_open_files_and_counts_refusals():
    class File:
        def __init__(self, path):
            self.path = path

    class Proc:
        def __init__(self, cwd, files, denied=False):
            self._cwd, self._files, self._denied = cwd, files, denied

        def cwd(self):
            if self._denied:
                raise psutil.AccessDenied(1)
            return self._cwd

        def open_files(self):
            return [File(f) for f in self._files]

    found = psutil_paths_in_use(
        lambda: [
            Proc("/Users/ai/.cache/mlx-share/tmpab12", ["/var/log/x.log"]),
            Proc("/", ["/Users/ai/.cache/mlx-share/tmpcd34/blobs/sha256-1"]),
            Proc("/", [], denied=True),
        ]
    )
    assert found.unreadable == 1
    assert found.under("/Users/ai/.cache/mlx-share") == {"tmpab12", "tmpcd34"}


def test_a_missing_dir_and_a_dir_replaced_by_a_file_are_skipped_with_a_log_line(
    share_dir, tmp_path, caplog
):
    missing = tmp_path / "never-created"
    walker = TmpWalker(
        [WatchedDir(share_dir), WatchedDir(missing)], launch_dirs=lambda: [], in_use=PathsInUse
    )
    collector = TmpDirsCollector(BackgroundWalker(walker.walk), first_scrape_wait=0)
    collector.walker.latest = walker.walk()
    families = list(collector.collect())
    assert sample_value(families, "mlx_stale_tmp_dirs", {"dir": str(share_dir)}) == 4
    assert sample_value(families, "mlx_stale_tmp_dir_readable", {"dir": str(missing)}) == 0
    assert sample_value(families, "mlx_stale_tmp_dirs", {"dir": str(missing)}) is None

    subprocess.run(["rm", "-rf", "--", str(share_dir)], check=True)
    share_dir.write_text("now a file")
    with caplog.at_level(logging.WARNING):
        collector.walker.latest = walker.walk()
        collector.walker.latest = walker.walk()
    families = list(collector.collect())
    assert sample_value(families, "mlx_stale_tmp_dir_readable", {"dir": str(share_dir)}) == 0
    assert sample_value(families, "mlx_stale_tmp_dirs", {"dir": str(share_dir)}) is None
    assert caplog.text.count(f"tmp dir {share_dir} skipped: not a directory") == 1


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A fresh dir under /tmp that an unprivileged user can reach (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="mlx-medic-tmpdirs-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def scan_as_nobody(path: Path, weigher: DuWeigher | PythonWeigher) -> list:
    """scan_watched_dir in a forked child that dropped root (as root, chmod alone stops nothing)."""
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            report = scan_watched_dir(WatchedDir(path), PathsInUse(), time.time(), weigher)
            os.write(
                write_end, json.dumps([report.error, report.stale_entries, report.skipped]).encode()
            )
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def test_an_unreadable_subtree_is_skipped_without_failing_the_walk(world_readable_dir, weigher):
    require_root()
    share = world_readable_dir / "share"
    write(share / "tmpA1234567" / "blobs" / "sha256-a", 10_000)
    write(share / "tmpB1234567" / "blobs" / "sha256-b", 10_000)
    for path in [share, *share.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (share / "tmpA1234567" / "blobs").chmod(0o700)  # root's: nobody may not look inside
    age_tree(share)
    error, stale, skipped = scan_as_nobody(share, weigher)
    assert error is None
    assert stale == 2
    assert skipped >= 1


def fake_result(stamp: float, stale: int) -> WalkResult:
    return WalkResult(stamp, 0.5, (DirReport("/cache", stale, stale * 4096, stamp - 900),), 7)


def test_a_scrape_during_a_long_walk_returns_the_previous_walk_at_once():
    walking, release = threading.Event(), threading.Event()
    calls = []

    def slow_walk() -> WalkResult:
        calls.append(1)
        if len(calls) == 1:
            return fake_result(1000.0, 3)
        walking.set()
        assert release.wait(60), "the test never released the walk"
        return fake_result(2000.0, 5)

    background = BackgroundWalker(slow_walk, interval=0.01).start()
    collector = TmpDirsCollector(background, clock=lambda: 1100.0, first_scrape_wait=0)
    try:
        assert walking.wait(30)  # the second walk is now blocked inside the "filesystem"
        families = list(collector.collect())
        assert sample_value(families, "mlx_stale_tmp_walk_timestamp_seconds", {}) == 1000.0
        assert sample_value(families, "mlx_stale_tmp_dirs", {"dir": "/cache"}) == 3
        assert sample_value(families, "mlx_stale_tmp_bytes", {"dir": "/cache"}) == 3 * 4096
        assert sample_value(families, "mlx_stale_tmp_oldest_age_seconds", {"dir": "/cache"}) == 1000
        assert sample_value(families, "mlx_launch_leftover_files", {}) == 7
    finally:
        release.set()
        collector.close()


def test_before_the_first_walk_completes_only_the_walk_timestamp_is_exported():
    release = threading.Event()
    background = BackgroundWalker(lambda: (release.wait(60), fake_result(1.0, 1))[1]).start()
    collector = TmpDirsCollector(background, first_scrape_wait=0)
    try:
        families = list(collector.collect())
        assert sample_value(families, "mlx_stale_tmp_walk_timestamp_seconds", {}) == 0
        assert sample_value(families, "mlx_stale_tmp_dirs", {"dir": "/cache"}) is None
    finally:
        release.set()
        collector.close()


def test_the_help_text_is_the_same_whatever_the_interval_and_the_walk_time_is_a_series():
    helps = []
    for interval in (120, 3600):
        background = BackgroundWalker(lambda: fake_result(1.0, 1), interval=interval)
        background.latest = fake_result(1.0, 1)
        families = {f.name: f for f in TmpDirsCollector(background, first_scrape_wait=0).collect()}
        helps.append({name: family.documentation for name, family in families.items()})
    assert helps[0] == helps[1]
    assert "mlx_stale_tmp_walk_timestamp_seconds" in helps[0]["mlx_stale_tmp_bytes"]


def test_a_failing_walk_makes_the_collector_fail_not_the_exporter():
    def broken() -> WalkResult:
        raise RuntimeError("disk on fire")

    background = BackgroundWalker(broken, interval=60).start()
    background.wait_first(30)
    scrape = ScrapeCollector([TmpDirsCollector(background, first_scrape_wait=0)])
    try:
        families = list(scrape.collect())
        assert sample_value(families, "mlx_medic_collector_success", {"collector": "tmpdirs"}) == 0
    finally:
        scrape.close()


def test_the_shared_rule_lists_exactly_the_entries_the_collector_counts(share_dir, weigher):
    """What the clean step deletes (`tmp_rules.stale_entries`) is what the exporter counts."""
    write(share_dir / "tmpfresh0001" / "blob", 4_000)  # changed just now
    write(share_dir / "tmpbusy00001" / "blob", 4_000)  # a process works in it
    os.symlink(share_dir / "tmp0abcdefg", share_dir / "tmpalias")  # a symlink: never an entry
    os.link(share_dir / "tmpfile_partial", share_dir / "tmpfile_second_name")
    age_tree(share_dir / "tmpbusy00001")
    busy = PathsInUse({str(share_dir / "tmpbusy00001")})
    now = time.time()
    listed = stale_entries(share_dir, now, 600, busy, weigher)
    report = scan_watched_dir(WatchedDir(share_dir, 600), busy, now, weigher)
    assert listed.error is report.error is None
    assert sorted(e.path.name for e in listed.entries) == [
        "tmp0abcdefg",
        "tmp1abcdefg",
        "tmp2abcdefg",
        "tmpfile_partial",
    ]  # one name per file
    assert len(listed.entries) == report.stale_entries
    assert sum(e.bytes for e in listed.entries) == report.stale_bytes
    assert min(e.newest_mtime for e in listed.entries) == report.oldest_mtime
    # Removing exactly what is listed leaves everything else in place; a file's second
    # name is an entry of its own once its first name is gone (its bytes count once).
    for entry in listed.entries:
        assert os.lstat(entry.path).st_ino == entry.inode
        if entry.is_dir:
            shutil.rmtree(entry.path)
        else:
            entry.path.unlink()
    again = stale_entries(share_dir, now, 600, busy, weigher)
    assert [e.path.name for e in again.entries] == ["tmpfile_second_name"]
    assert scan_watched_dir(WatchedDir(share_dir, 600), busy, now, weigher).stale_entries == 1
    assert {p.name for p in share_dir.iterdir()} == {
        "tmpfresh0001",
        "tmpbusy00001",
        "tmpalias",
        "tmpfile_second_name",
        "models--mlx-community--GLM",
    }


# --- mlx.launch leftovers -----------------------------------------------------------


def run_launch_script(temp_dir: Path, command: list[str], files: dict[str, str]):
    """mlx.launch's own rank script (as installed), run locally with mktemp in `temp_dir`."""
    launch = pytest.importorskip("mlx._distributed_utils.launch")
    script = launch.RemoteProcess.make_launch_script(0, None, None, files, [], command, True)
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(temp_dir)}
    return subprocess.Popen(["/bin/bash", "-c", script], env=env, stdout=subprocess.PIPE, text=True)


RING_HOSTFILE = json.dumps([["127.0.0.1:32323"], ["127.0.0.2:32324"]])
IBV_DEVICES = json.dumps([[None, "rdma_en5"], ["rdma_en5", None]])


def test_the_launchers_real_pid_file_and_hostfile_count_once_the_rank_is_gone(tmp_path):
    temp_dir = tmp_path / "T"
    temp_dir.mkdir()
    rank = run_launch_script(temp_dir, ["sleep", "120"], {"MLX_HOSTFILE": RING_HOSTFILE})
    try:
        assert rank.stdout is not None
        pidfile = Path(rank.stdout.readline().strip())  # the script prints its pid file first
        assert pidfile.parent == temp_dir
        deadline = time.monotonic() + 30  # the script has written its files once it execs
        while psutil.Process(rank.pid).cmdline() != ["sleep", "120"]:
            assert time.monotonic() < deadline, "the launch script never exec'd its command"
            time.sleep(0.01)
        counter = LeftoverCounter()
        assert counter.count([temp_dir]) == 0  # rank alive: its pid is live, its env holds the file
    finally:
        rank.kill()
        rank.wait()
    assert LeftoverCounter().count([temp_dir]) == 1  # the dead launch's pid file at once
    age(temp_dir.glob("tmp.*"), 600)
    assert LeftoverCounter().count([temp_dir]) == 2  # its hostfile once it is no launch's


def test_only_files_that_look_like_the_launchers_are_counted(tmp_path):
    temp_dir = tmp_path / "T"
    temp_dir.mkdir()
    done = run_launch_script(temp_dir, ["true"], {"MLX_IBV_DEVICES": IBV_DEVICES})
    done.wait()
    (temp_dir / "tmp.Ab3dE6gH9j").write_text(f"{os.getpid()}\n")  # a live pid: not left over
    (temp_dir / "tmp.Zz9yY8xX7w").write_text("some other program's scratch\n")
    (temp_dir / "tmp.Qq1wW2eE3r").write_text('{"backend": "ring"}\n')
    (temp_dir / "notes.txt").write_text("12345\n")  # not mktemp's name
    (temp_dir / "tmp.Sym1ink000").symlink_to(next(temp_dir.glob("tmp.*")))
    (temp_dir / "tmp.Dir0000000").mkdir()
    assert LeftoverCounter().count([temp_dir]) == 1  # the real pid file; the devices file
    age(temp_dir.glob("tmp.*"), 600)  # is young (a launch may be under way) until it ages
    assert LeftoverCounter().count([temp_dir]) == 2


def age(paths, seconds: float) -> None:
    """Make files look `seconds` old (their mtime), never following a link."""
    then = time.time() - seconds
    for path in paths:
        if not path.is_symlink():
            os.utime(path, (then, then))


def test_the_shared_rule_lists_exactly_the_leftovers_the_collector_counts(tmp_path):
    temp_dir = tmp_path / "T"
    temp_dir.mkdir()
    (temp_dir / "tmp.Dead000001").write_text(f"{dead_pid()}\n")
    (temp_dir / "tmp.Live000001").write_text(f"{os.getpid()}\n")
    (temp_dir / "tmp.Host000001").write_text(RING_HOSTFILE + "\n")
    (temp_dir / "tmp.Other00001").write_text("some other program's scratch\n")
    (temp_dir / "tmp.Link000001").symlink_to(temp_dir / "tmp.Dead000001")
    (temp_dir / "tmp.Young00001").write_text(RING_HOSTFILE + "\n")
    age([temp_dir / "tmp.Host000001"], 600)
    scan = launcher_leftovers([temp_dir, tmp_path / "gone"])
    # A dead launch's pid file goes whatever its age; an unowned hostfile only once old.
    assert sorted(p.name for p in scan.files) == ["tmp.Dead000001", "tmp.Host000001"]
    assert scan.read == (temp_dir,) and [d for d, _ in scan.unreadable] == [tmp_path / "gone"]
    assert LeftoverCounter().count([temp_dir, tmp_path / "gone"]) == len(scan.files)


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (b"71234\n", "pidfile"),
        (RING_HOSTFILE.encode() + b"\n", "hostfile"),
        (IBV_DEVICES.encode() + b"\n", "hostfile"),
        (
            json.dumps(
                [[None, ["rdma_en3", "rdma_en4"]], [["rdma_en3", "rdma_en4"], None]]
            ).encode(),
            "hostfile",
        ),
        (b"\n", None),  # a one-host ring writes an empty hostfile: nothing to tell it by
        (b"[1, 2, 3]", None),
        (b"\x00\xff garbage", None),
        (b'[["not an address"]]', None),
    ],
)
def test_launch_files_are_told_apart_by_content(content, kind):
    assert classify_launch_file(content) == kind


# --- defaults and the platform seam --------------------------------------------------


def test_the_macos_temp_dir_comes_from_getconf_not_tmpdir():
    lines = (FIXTURES / "getconf_darwin_user_temp_dir.txt").read_text().splitlines()
    output = "\n".join(line for line in lines if not line.startswith("#")) + "\n"
    asked = []

    def runner(argv, timeout):
        asked.append(list(argv))
        return CompletedCommand(tuple(argv), 0, output, "")

    dirs = launch_temp_dirs("darwin", runner, {"TMPDIR": "/opt/mlx/tmp"})
    assert asked == [["getconf", "DARWIN_USER_TEMP_DIR"]]
    assert dirs == [Path("/var/folders/qg/s5jp5ffx2p1fxv0hy2l_p3hm0000gn/T")]


def getconf_fixture(name: str) -> str:
    lines = (FIXTURES / name).read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("#")) + "\n"


def test_an_exporter_running_as_root_asks_getconf_as_the_service_user_not_itself():
    """mlx.launch's pid file lands in the service user's DARWIN_USER_TEMP_DIR; root's own
    answer (`/var/folders/zz/...`) is another dir, so getconf is asked as that user."""
    asked_as: list[str | None] = []

    def runner_for(user: str | None):
        def runner(argv, timeout):
            asked_as.append(user)
            assert list(argv) == ["getconf", "DARWIN_USER_TEMP_DIR"]
            fixture = (
                "getconf_darwin_user_temp_dir_root.txt"
                if user is None
                else "getconf_darwin_user_temp_dir.txt"
            )
            return CompletedCommand(tuple(argv), 0, getconf_fixture(fixture), "")

        return runner

    def dirs(users):
        return user_temp_dirs(
            users,
            "darwin",
            runner_for(None),
            runner_for,
            environ={"TMPDIR": "/opt/mlx/tmp"},
            me=lambda: "root",
        )

    assert dirs(["ai"]) == [Path("/var/folders/qg/s5jp5ffx2p1fxv0hy2l_p3hm0000gn/T")]
    assert asked_as == ["ai"]
    assert dirs([None]) == [Path("/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T")]
    assert dirs(["root"]) == dirs([None])  # the exporter's own user: asked directly
    assert dirs(["ai", None, "ai"]) == [  # each user asked once, each dir listed once
        Path("/var/folders/qg/s5jp5ffx2p1fxv0hy2l_p3hm0000gn/T"),
        Path("/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T"),
    ]


def test_a_service_user_whose_temp_dir_cannot_be_asked_for_is_logged_and_left_out(caplog):
    def refused(user: str):
        def runner(argv, timeout):
            raise CommandError(f"`getconf DARWIN_USER_TEMP_DIR` could not run as {user}: denied")

        return runner

    with caplog.at_level(logging.WARNING):
        found = user_temp_dirs(["ai"], "darwin", runner_as=refused, me=lambda: "medic")
    assert found == []
    assert "cannot find ai's temp dir" in caplog.text and "denied" in caplog.text


def test_on_linux_another_users_temp_dir_is_the_default_tmp_and_ours_follows_tmpdir():
    mine = {"TMPDIR": "/var/tmp/medic"}
    assert user_temp_dirs(["nobody"], "linux", environ=mine, me=lambda: "root") == [Path("/tmp")]
    assert user_temp_dirs([None], "linux", environ=mine, me=lambda: "root") == [
        Path("/var/tmp/medic"),
        Path("/tmp"),
    ]


def test_a_command_asked_as_another_user_runs_as_that_user():
    require_root()
    assert output_of(as_user("nobody"), ["id", "-un"], 10).strip() == "nobody"
    with pytest.raises(CommandError, match="could not run as no-such-user"):
        as_user("no-such-user")(["id"], 10)


SERVICE_USER_INVENTORY = """
nodes: {ai001: {ssh: 127.0.0.1}, ai002: {ssh: 127.0.0.2}}
models:
  a:
    model: m
    nodes: [ai001, ai002]
    port: 8080
    service: {manager: launchd, label: a, user: nobody}
    backends: {ring: {hostfile: /etc/h.json}}
"""


def test_the_exporter_counts_leftovers_in_the_temp_dir_of_the_models_service_user(
    tmp_path, monkeypatch
):
    """The inventory names the user each model's service runs as; with none, the exporter
    looks in its own user's temp dir; `launch_temp_dirs` overrides both."""
    if sys.platform == "darwin":
        pytest.skip("the Linux default; macOS asks getconf (tested above)")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    inventory = parse_inventory(SERVICE_USER_INVENTORY)
    on_peer = ExporterContext(node="ai002", inventory=inventory)
    assert tmpdirs.launch_dirs_of(on_peer)() == [Path("/tmp")]  # nobody's, not our $TMPDIR
    no_user = parse_inventory(SERVICE_USER_INVENTORY.replace(", user: nobody", ""))
    ours = [tmp_path, Path("/tmp")]
    assert tmpdirs.launch_dirs_of(ExporterContext(node="ai002", inventory=no_user))() == ours
    assert tmpdirs.launch_dirs_of(ExporterContext(node=None, inventory=None))() == ours
    pinned = parse_inventory(SERVICE_USER_INVENTORY + f"launch_temp_dirs: [{tmp_path}/T]\n")
    assert tmpdirs.launch_dirs_of(ExporterContext(node="ai002", inventory=pinned))() == [
        tmp_path / "T"
    ]


def test_linux_uses_tmpdir_then_tmp_and_bad_getconf_output_is_named():
    assert launch_temp_dirs("linux", environ={"TMPDIR": "/var/tmp/x"}) == [
        Path("/var/tmp/x"),
        Path("/tmp"),
    ]
    assert launch_temp_dirs("linux", environ={}) == [Path("/tmp")]
    with pytest.raises(ValueError, match="not one absolute path"):
        parse_darwin_user_temp_dir("getconf: no such configuration parameter\n")


def test_without_an_inventory_no_tmp_dir_is_walked_but_leftovers_are_counted(tmp_path):
    context = ExporterContext(node="n1", inventory=None, state_dir=tmp_path)
    assert tmpdirs.watched_dirs(context) == []
    collector = tmpdirs.make(context)
    try:
        families = list(collector.collect())  # the first scrape waits briefly for the first walk
        assert sample_value(families, "mlx_stale_tmp_walk_timestamp_seconds", {}) > 0
        assert sample_value(families, "mlx_launch_leftover_files", {}) is not None
    finally:
        collector.close()


def test_the_inventory_gives_every_tmp_and_cache_dir_of_this_nodes_models():
    inventory = parse_inventory("""
nodes: {ai001: {ssh: 127.0.0.1}, ai002: {ssh: 127.0.0.2}}
models:
  a:
    model: m
    nodes: [ai001, ai002]
    port: 8080
    service: {manager: supervisord, label: a}
    backends: {ring: {hostfile: /etc/h.json}}
    tmp_dirs: [/srv/share/a]
    cache_dirs: [/srv/hf]
    policy: {stale_tmp_age: 30m}
  b:
    model: m
    nodes: [ai002]
    port: 8081
    service: {manager: supervisord, label: b}
    backends: {ring: {hostfile: /etc/h.json}}
    cache_dirs: [/srv/hf]
    policy: {stale_tmp_age: 2h}
""")
    on_ai001 = tmpdirs.watched_dirs(ExporterContext(node="ai001", inventory=inventory))
    assert on_ai001 == [WatchedDir(Path("/srv/share/a"), 1800), WatchedDir(Path("/srv/hf"), 1800)]
    on_ai002 = tmpdirs.watched_dirs(ExporterContext(node="ai002", inventory=inventory))
    assert WatchedDir(Path("/srv/hf"), 7200) in on_ai002


def test_a_missing_launch_temp_dir_is_logged_once_and_the_metric_is_absent(tmp_path, caplog):
    counter = LeftoverCounter()
    with caplog.at_level(logging.WARNING):
        assert counter.count([tmp_path / "gone"]) is None
        assert counter.count([tmp_path / "gone"]) is None
    assert caplog.text.count("launch temp dir") == 1
