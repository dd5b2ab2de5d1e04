#!/usr/bin/env python3
"""The tmpdirs walk against `du -s` on the same tree, in the same run.

Builds a cache dir with 200 stale `tmp*` dirs holding 100,000 files in all
(half of each dir's files one level down, in `blobs/`, like mlx_lm.share's
partial downloads), warms the cache with one untimed pass of each, then times,
alternately and several times: `du -s <dir>` (a subprocess, the peer), our
`scan_watched_dir` the way the product runs it (its default weigher: GNU du
on Linux, one run for all entries, plus our own listing and parsing), and the
pure Python walk (what macOS, or a failing du, gets) for reference. Reports
the medians and their ratio to du, of wall time and of CPU time (user+sys,
our process plus its children; steadier on a shared machine).
Also times one whole `TmpWalker.walk()` (adds the scan of every process's
open paths, which depends on the process table, not the tree).

    python3 bench/tmpwalk/run.py [--dirs 200] [--files 100000] [--repeat 9]

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

from mlx_medic.exporter.collectors.tmpdirs import (  # noqa: E402
    TmpWalker,
    WatchedDir,
    scan_watched_dir,
)
from mlx_medic.platform.open_paths import PathsInUse  # noqa: E402
from mlx_medic.platform.weighers import PythonWeigher, Weigher, default_weigher  # noqa: E402


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


def time_ours(root: Path, weigher: Weigher) -> tuple[float, float, int]:
    """Wall and CPU seconds (ours and du's if it runs one) of one scan, and its stale bytes."""
    cpu, start = time.process_time() + children_cpu(), time.perf_counter()
    report = scan_watched_dir(WatchedDir(root), PathsInUse(), time.time(), weigher)
    elapsed = time.perf_counter() - start
    return elapsed, time.process_time() + children_cpu() - cpu, report.stale_bytes


def line(label: str, times: list[float]) -> str:
    return f"{label:<22} median {statistics.median(times) * 1000:6.1f} ms  runs " + " ".join(
        f"{t * 1000:.0f}" for t in times
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=200)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    du = shutil.which("du")
    if du is None:
        print("du is not installed", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="mlx-medic-bench-tmpwalk-", dir="/var/tmp"))
    root = work / "mlx-share"
    try:
        build_tree(root, args.dirs, args.files)
        product, python = default_weigher(), PythonWeigher()
        time_du(du, root)  # warm the dentry and inode caches for all
        time_ours(root, product)
        time_ours(root, python)
        runs: dict[str, list[tuple[float, float]]] = {"du": [], "product": [], "python": []}
        du_kib = product_bytes = python_bytes = 0
        for _ in range(args.repeat):
            elapsed, cpu, du_kib = time_du(du, root)
            runs["du"].append((elapsed, cpu))
            elapsed, cpu, product_bytes = time_ours(root, product)
            runs["product"].append((elapsed, cpu))
            elapsed, cpu, python_bytes = time_ours(root, python)
            runs["python"].append((elapsed, cpu))
        walker = TmpWalker([WatchedDir(root)], launch_dirs=lambda: [], weigher=product)
        start = time.perf_counter()
        walker.walk()
        whole = time.perf_counter() - start
        wall = {k: [w for w, _ in v] for k, v in runs.items()}
        cpu_median = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        wall_median = {k: statistics.median(v) for k, v in wall.items()}
        root_kib = os.stat(root).st_blocks // 2  # du -s also counts the top dir itself
        version = subprocess.run([du, "--version"], capture_output=True, text=True).stdout
        print(
            f"machine: {platform.platform()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, {version.splitlines()[0] if version else du}, "
            f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        print(f"product weigher: {type(product).__name__}")
        print(
            f"tree: {args.dirs} tmp dirs, {args.files} files, du -s -k = {du_kib} KiB, "
            f"product = {math.ceil(product_bytes / 1024)} KiB, "
            f"python = {math.ceil(python_bytes / 1024)} KiB, + top dir {root_kib} KiB"
        )
        print(line("du -s", wall["du"]))
        print(line("product (default)", wall["product"]))
        print(line("pure Python walk", wall["python"]))
        for key, label in (("product", "product"), ("python", "pure Python")):
            print(
                f"ratio {label} / du: wall {wall_median[key] / wall_median['du']:.2f}"
                f"  CPU {cpu_median[key] / cpu_median['du']:.2f}"
                + ("  (goal <= 1.20)" if key == "product" else "")
            )
        print(
            "CPU (user+sys) medians: "
            + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in cpu_median.items())
        )
        print(f"whole TmpWalker.walk() incl. the open-path scan: {whole * 1000:.0f} ms")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
