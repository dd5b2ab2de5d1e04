#!/usr/bin/env python3
"""The logs collector's reading against `grep -c -F` with the same literals, same run.

Writes a log of `--size` MiB (default 1024): server-like lines with one error
line from the signature texts every ~5,000 lines. Warms the page cache with
one untimed pass of each, then alternately times:

- grep: `grep -c -F -e LIT ...` with every built-in signature's literal
  anchors (`LC_ALL=C`, its fastest mode), a subprocess, wall clock;
- ours: a fresh `LogsCollector` (empty state dir, no per-scrape read limit)
  scraping the file once: it reads every byte, finds candidate lines, runs the
  regexes, saves the state.

Reports median MB/s of each and the ratio, for the Hyperscan engine (when
installed) and the `bytes.find` fallback, and checks both count what grep does.

    python3 bench/logread/run.py [--size 1024] [--repeat 5]

The file lives in a fresh dir under /var/tmp and is removed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mlx_medic.exporter.collector import sample_value  # noqa: E402
from mlx_medic.exporter.collectors.logs import LogsCollector  # noqa: E402
from mlx_medic.signatures import BUILTIN  # noqa: E402

NORMAL = [
    b'INFO:     127.0.0.1:52344 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n',
    b"2026-11-30 02:11:04,120 - INFO - Prompt processing progress: 2048/8192\n",
    b"2026-11-30 02:11:05,004 - DEBUG - KV cache trimmed to 4096 tokens for request 8f2a1c\n",
    b"[rank 1] step 1203 tokens/s=41.2 peak memory 61.3 GB\n",
    b"2026-11-30 02:11:06,311 - INFO - Starting httpd at 127.0.0.1 on port 8080...\n",
]
ERRORS = [
    b"RuntimeError: [jaccl] Couldn't allocate protection domain\n",
    b"[jaccl] Changing queue pair to RTR failed with errno 16\n",
    b"[jaccl] Couldn't connect (error: 60)\n",
    b"libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] "
    b"Command buffer execution failed: Caused GPU Timeout Error "
    b"(00000002:kIOGPUCommandBufferCallbackErrorTimeout).\n",
    b"[metal::malloc] Resource limit (499000) exceeded.\n",
    b"\x1b[33m[WARN] Node with rank 1 exited with code 1 \x1b[0m\n",
    b"[ring] connection to a peer was lost\n",
    b"Exception in thread Thread-2 (_generate):\n",
]


def write_log(path: Path, size: int) -> None:
    rng = random.Random(7)
    block = b"".join(rng.choice(NORMAL) for _ in range(5000))
    written = 0
    with open(path, "wb") as f:
        while written < size:
            f.write(block)
            f.write(rng.choice(ERRORS))
            written += len(block) + 80


def literals() -> list[str]:
    return sorted({a.decode() for s in BUILTIN for a in s.anchors})


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def grep_argv(grep: str, path: Path) -> list[str]:
    argv = [grep, "-c", "-F"]
    for literal in literals():
        argv += ["-e", literal]
    return [*argv, str(path)]


def time_grep(grep: str, path: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds of grep, and its count of matching lines."""
    cpu, start = children_cpu(), time.perf_counter()
    done = subprocess.run(
        grep_argv(grep, path),
        capture_output=True,
        text=True,
        env=dict(os.environ, LC_ALL="C"),
        check=False,
    )
    elapsed = time.perf_counter() - start
    return elapsed, children_cpu() - cpu, int(done.stdout.strip() or 0)


def time_ours(path: Path, engine: str) -> tuple[float, float, int]:
    """Wall and CPU seconds of one first scrape, and the errors it counted."""
    state = Path(tempfile.mkdtemp(prefix="state-", dir=path.parent))
    try:
        cpu, start = time.process_time(), time.perf_counter()
        collector = LogsCollector(
            [str(path)], BUILTIN, state / "p.json", engine=engine, max_read_per_scrape=None
        )
        families = list(collector.collect())
        elapsed, spent = time.perf_counter() - start, time.process_time() - cpu
        collector.close()
    finally:
        shutil.rmtree(state)
    total = sum(
        sample_value(families, "mlx_log_errors_total", {"signature": s.name, "file": str(path)})
        or 0
        for s in BUILTIN
    )
    return elapsed, spent, int(total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="MiB of log")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    grep = shutil.which("grep")
    if grep is None:
        print("grep is not installed", file=sys.stderr)
        return 2
    engines = ["find"]
    if importlib.util.find_spec("hyperscan") is not None:
        engines.insert(0, "hyperscan")
    work = Path(tempfile.mkdtemp(prefix="mlx-medic-bench-logread-", dir="/var/tmp"))
    path = work / "model.err.log"
    try:
        write_log(path, args.size << 20)
        megabytes = path.stat().st_size / 1e6
        _, _, grep_count = time_grep(grep, path)  # warm the page cache
        times: dict[str, list[float]] = {"grep": [], **{e: [] for e in engines}}
        cpus: dict[str, list[float]] = {"grep": [], **{e: [] for e in engines}}
        counts: dict[str, int] = {"grep": grep_count}
        for engine in engines:
            time_ours(path, engine)
        for _ in range(args.repeat):
            elapsed, cpu, counts["grep"] = time_grep(grep, path)
            times["grep"].append(elapsed)
            cpus["grep"].append(cpu)
            for engine in engines:
                elapsed, cpu, counts[engine] = time_ours(path, engine)
                times[engine].append(elapsed)
                cpus[engine].append(cpu)
        version = subprocess.run([grep, "--version"], capture_output=True, text=True).stdout
        print(
            f"machine: {platform.platform()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, {version.splitlines()[0]}"
        )
        print(
            f"file: {megabytes:.0f} MB, {len(literals())} literals, matching lines: "
            + ", ".join(f"{k}={v}" for k, v in counts.items())
        )
        print("grep command: LC_ALL=C " + shlex.join(grep_argv(grep, path)))
        rates = {k: megabytes / statistics.median(v) for k, v in times.items()}
        cpu_rates = {k: megabytes / statistics.median(v) for k, v in cpus.items()}
        for name, runs in times.items():
            median = statistics.median(runs)
            print(
                f"{name:10s} wall median {median:.3f} s = {rates[name]:5.0f} MB/s"
                f"; CPU {cpu_rates[name]:5.0f} MB/s; wall runs "
                + " ".join(f"{t:.3f}" for t in runs)
            )
        for engine in engines:
            print(
                f"ratio ({engine} / grep throughput): wall {rates[engine] / rates['grep']:.2f}, "
                f"CPU {cpu_rates[engine] / cpu_rates['grep']:.2f}  (goal >= 0.80)"
            )
        return 0 if all(counts[e] == counts["grep"] for e in engines) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
