#!/usr/bin/env python3
"""Time to first scrape: scripts/run-exporter.sh on a set-up checkout beside its peer,
`.venv/bin/mlx-medic exporter` started directly, in the same run.

Every round starts each of the two, one after the other (the order alternates between
rounds), with `--web.listen-address 127.0.0.1:PORT` on a free port, and times from the exec
to the first GET /metrics answered 200 with a body (polled every 5 ms). Each exporter is
then stopped by its pid: SIGTERM, SIGKILL after 10 s. One untimed start of each comes first
(warm page cache and bytecode). Prints every time, the medians and their ratio.

    .venv/bin/python bench/first_scrape/run.py [--rounds 5]

Refuses to run unless .venv is current (scripts/venv-stamp.sh): the script would run
scripts/setup.sh first, and the bench would time an install, not a start.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from testbed.net import free_port  # noqa: E402
from testbed.processes import stop_child  # noqa: E402

SCRIPT = "scripts/run-exporter.sh"
DIRECT = ".venv/bin/mlx-medic exporter"
STARTS = {
    SCRIPT: [str(REPO / "scripts" / "run-exporter.sh")],
    DIRECT: [str(REPO / ".venv" / "bin" / "mlx-medic"), "exporter"],
}


def answered(url: str) -> bool:
    """True once `url` answers 200 with a body; False while nothing (or not yet) serves it."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200 and bool(response.read())
    except OSError:  # refused, reset, or an HTTP error
        return False


def time_to_first_scrape(argv: list[str], timeout: float) -> float:
    """Seconds from starting `argv` on a free port to its first answered GET /metrics."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [*argv, "--web.listen-address", f"127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while not answered(url):
                exited = proc.poll() is not None
                if exited or time.perf_counter() - start > timeout:
                    log.seek(0)
                    said = log.read().decode(errors="replace").strip()[-2000:]
                    what = f"exited with {proc.returncode}"
                    if not exited:
                        what = f"did not answer within {timeout:.0f} s"
                    raise RuntimeError(f"{' '.join(argv)} {what}; it said:\n{said}")
                time.sleep(0.005)
            return time.perf_counter() - start
        finally:
            stop_child(proc, grace=10)


def venv_is_current() -> bool:
    check = subprocess.run(
        ["bash", "-c", ". scripts/venv-stamp.sh && venv_current base"], cwd=REPO, timeout=30
    )
    return check.returncode == 0


def describe_checkout() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30
        ).stdout.strip()

    dirty = " (with uncommitted changes)" if git("status", "--porcelain") else ""
    return f"{REPO} at {git('rev-parse', '--short', 'HEAD')}{dirty}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed starts of each (default 5)")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a start may take (default 60)"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected at least 1")
    if not venv_is_current():
        print(
            f"{REPO / '.venv'} is not current (no .venv/bin/mlx-medic, or no stamp of today's "
            "pyproject.toml and scripts/setup.sh): run scripts/setup.sh first, or "
            f"{SCRIPT} would time an install",
            file=sys.stderr,
        )
        return 2

    load_before = os.getloadavg()
    for argv in STARTS.values():
        time_to_first_scrape(argv, args.timeout)
    taken: dict[str, list[float]] = {name: [] for name in STARTS}
    for round_ in range(args.rounds):
        order = list(STARTS) if round_ % 2 == 0 else list(reversed(STARTS))
        for name in order:
            taken[name].append(time_to_first_scrape(STARTS[name], args.timeout))
    load_after = os.getloadavg()

    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; load average {load_before[0]:.2f} at the start, "
        f"{load_after[0]:.2f} at the end"
    )
    print(f"checkout: {describe_checkout()}; PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    print(f"{args.rounds} timed starts of each after one untimed; seconds to the first scrape\n")
    medians = {name: statistics.median(times) for name, times in taken.items()}
    print("| start | times (s) | median (s) | ratio to direct |")
    print("|---|---|---:|---:|")
    for name, times in taken.items():
        listed = ", ".join(f"{t:.3f}" for t in times)
        ratio = medians[name] / medians[DIRECT]
        print(f"| `{name}` | {listed} | {medians[name]:.3f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
