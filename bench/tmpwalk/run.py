#!/usr/bin/env python3
"""The tmpdirs walk against `du -s` on the same tree, in the same run.

Builds a cache dir with 200 stale `tmp*` dirs holding 100,000 files in all
(half of each dir's files one level down, in `blobs/`, like mlx_lm.share's
partial downloads), warms the cache with one untimed pass of each, then times
`du -s <dir>` (a subprocess) and our `scan_watched_dir` (in process)
alternately, several times, and reports the medians and their ratio, of wall
time and of CPU time (user+sys; steadier on a shared machine).
Also times one whole `TmpWalker.walk()` (adds the scan of every process's
open paths, which depends on the process table, not the tree).

    python3 bench/tmpwalk/run.py [--dirs 200] [--files 100000] [--repeat 7]

The tree lives in a fresh dir under /var/tmp and is removed at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from exporter.collectors.tmpdirs import TmpWalker, WatchedDir, scan_watched_dir  # noqa: E402
from mlx_medic.platform.open_paths import PathsInUse  # noqa: E402


def build_tree(root: Path, dirs: int, files: int) -> None:
    old = time.time() - 86400
    per_dir = files // dirs
    payload = b"x" * 1500
    for d in range(dirs):
        entry = root / f"tmp{d:05d}mlxshare"
        (entry / "blobs").mkdir(parents=True)
        for i in range(per_dir):
            target = entry / "blobs" if i % 2 else entry
            with open(target / f"part{i:05d}", "wb") as f:
                if i % 4 == 0:  # a quarter of the files hold data, the rest are empty
                    f.write(payload)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (old, old))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_du(du: str, root: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds of `du -s -k`, and its KiB."""
    cpu, start = children_cpu(), time.perf_counter()
    out = subprocess.run([du, "-s", "-k", str(root)], check=True, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    return elapsed, children_cpu() - cpu, int(out.stdout.split()[0])


def time_ours(root: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds of one scan, and its stale bytes."""
    cpu, start = time.process_time(), time.perf_counter()
    report = scan_watched_dir(WatchedDir(root), PathsInUse(), time.time())
    elapsed = time.perf_counter() - start
    return elapsed, time.process_time() - cpu, report.stale_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=200)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    du = shutil.which("du")
    if du is None:
        print("du is not installed", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="mlx-medic-bench-tmpwalk-", dir="/var/tmp"))
    root = work / "mlx-share"
    try:
        build_tree(root, args.dirs, args.files)
        time_du(du, root)  # warm the dentry and inode caches for both
        time_ours(root)
        du_times, our_times, du_cpu, our_cpu = [], [], [], []
        du_kib = our_bytes = 0
        for _ in range(args.repeat):
            elapsed, cpu, du_kib = time_du(du, root)
            du_times.append(elapsed)
            du_cpu.append(cpu)
            elapsed, cpu, our_bytes = time_ours(root)
            our_times.append(elapsed)
            our_cpu.append(cpu)
        walker = TmpWalker([WatchedDir(root)], launch_dirs=lambda: [])
        start = time.perf_counter()
        walker.walk()
        whole = time.perf_counter() - start
        du_median, our_median = statistics.median(du_times), statistics.median(our_times)
        root_kib = os.stat(root).st_blocks // 2  # du -s also counts the top dir itself
        version = subprocess.run([du, "--version"], capture_output=True, text=True).stdout
        print(f"machine: {platform.platform()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}, {version.splitlines()[0] if version else du}")
        print(f"tree: {args.dirs} tmp dirs, {args.files} files, "
              f"du -s -k = {du_kib} KiB, ours = {math.ceil(our_bytes / 1024)} KiB "
              f"+ top dir {root_kib} KiB")
        print(f"du -s     median {du_median * 1000:.1f} ms  runs "
              + " ".join(f"{t * 1000:.0f}" for t in du_times))
        print(f"our walk  median {our_median * 1000:.1f} ms  runs "
              + " ".join(f"{t * 1000:.0f}" for t in our_times))
        print(f"ratio (ours / du), wall: {our_median / du_median:.2f}  (goal <= 1.20)")
        cpu_du, cpu_ours = statistics.median(du_cpu), statistics.median(our_cpu)
        print(f"CPU (user+sys) median: du {cpu_du * 1000:.1f} ms, ours {cpu_ours * 1000:.1f} ms, "
              f"ratio {cpu_ours / cpu_du:.2f}")
        print(f"whole TmpWalker.walk() incl. the open-path scan: {whole * 1000:.0f} ms")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
