"""What a node helper's CPU is made of: a fresh interpreter per call (a process per call,
`ssh.helper_sessions: false`) against the same helper forked from a process that has
already imported it, and against a call through a helper session (`mlx-medic node
session`, what the SSH transport uses since 2026-12-05: its fork, its pipes, its loop).
Issue 28's fleet goals are bound by the first; this bench says how much of it is the
start. The session's own opening (an interpreter that imports every helper) is measured
apart, as the median of five sessions that run nothing.

Each helper runs `--repetitions` times each way, from a wheel install of this checkout
in a plain venv (bench/node_install.py, as the fleet benches' nodes run it), against an
inventory of one model whose name and process pattern carry a fresh token, so no
process on the machine matches it, on a port free when the bench starts: the sweep runs
with `--dry-run` and signals nothing, the probe finds nothing listening. CPU is the
children's user + system time (`getrusage`) with the parent's own (its fork or its spawn)
each time; the forked way's parent first runs the helper once in itself, so the modules
it imports lazily are loaded before the fork, as in a process that has served a request
already.

    PYTHONPATH=$PWD .venv/bin/python bench/helper_start/run.py --repetitions 40
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.node_install import install_node_medic
from testbed import free_port

HELPERS = {
    "lock show": ["lock", "{model}", "show"],
    "run show": ["run", "{model}", "show"],
    "orphans": ["orphans", "{model}"],
    "sweep --dry-run": ["sweep", "{model}", "--dry-run"],
    "probe": ["probe", "{model}", "--timeout", "1"],
    "facts": ["facts", "{model}"],
}

# Runs in the installed venv's interpreter: `fresh` or `forked`, then the helper's argv.
CHILD = """\
import os, resource, subprocess, sys

way, repetitions, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
devnull = os.open(os.devnull, os.O_WRONLY)


def spent_cpu():
    # the children's CPU, and this process's own (a fork copies its page tables)
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (
            resource.getrusage(resource.RUSAGE_CHILDREN),
            resource.getrusage(resource.RUSAGE_SELF),
        )
    )


def quiet():
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


samples = []
if way == "fresh":
    for _ in range(repetitions):
        before = spent_cpu()
        subprocess.run(
            [sys.executable, "-c", "import sys; from mlx_medic.cli import main;"
             " sys.exit(main(sys.argv[1:]))", *argv],
            stdout=devnull, stderr=devnull, check=False,
        )
        samples.append(spent_cpu() - before)
else:
    from mlx_medic.cli import main

    out, err = os.dup(1), os.dup(2)
    quiet()
    try:
        main(list(argv))  # loads what the helper imports lazily
    except SystemExit:
        pass
    os.dup2(out, 1)
    os.dup2(err, 2)
    for _ in range(repetitions):
        before = spent_cpu()
        pid = os.fork()
        if pid == 0:
            quiet()
            try:
                main(list(argv))
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        samples.append(spent_cpu() - before)
print(" ".join(f"{s:.6f}" for s in samples))
"""


def inventory(token: str, state_dir: Path) -> str:
    return f"""\
state_dir: {state_dir}
nodes:
  n1: {{ssh: 127.0.0.2}}
models:
  bench-{token}:
    model: /models/bench-{token}
    nodes: [n1]
    port: {free_port()}
    service: {{manager: supervisord, label: bench-{token}}}
    backends: {{ring: {{hostfile: /etc/ring-{token}.json}}}}
    process_patterns: {{rank: ['serve-{token}\\.py']}}
"""


def measure(python: Path, way: str, repetitions: int, argv: list[str], env: dict[str, str]):
    result = subprocess.run(
        [str(python), "-c", CHILD, way, str(repetitions), *argv],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env=env,
    )
    return [float(s) for s in result.stdout.split()]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def session_cpu(medic: Path, config: Path, env: dict[str, str], requests: list[list[str]]) -> float:
    """CPU of one helper session (`mlx-medic node session`) that runs `requests` one after
    another and ends: its start, its loop and its children."""
    before = children_cpu()
    session = subprocess.Popen(
        [str(medic), "node", "session", "--inventory", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert session.stdin is not None and session.stdout is not None
    if '"session"' not in session.stdout.readline().decode():
        raise RuntimeError("the session said no hello")
    for number, argv in enumerate(requests):
        session.stdin.write(json.dumps({"id": number, "argv": ["mlx-medic", *argv]}).encode())
        session.stdin.write(b"\n")
        session.stdin.flush()
        reply = json.loads(session.stdout.readline())
        if reply.get("exit_status") not in (0, 1) or '"schema"' not in reply.get("stdout", ""):
            raise RuntimeError(f"{argv}: {reply}")
    session.stdin.close()
    session.wait(60)
    return children_cpu() - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=40)
    args = parser.parse_args()
    token = uuid.uuid4().hex[:8]
    workdir = Path("/var/tmp") / f"mlx-medic-bench-helper-start-{token}"
    try:
        medic = install_node_medic(workdir / "node-medic")
        python = medic.parent / "python"
        config = workdir / "inventory.yaml"
        config.write_text(inventory(token, workdir / "state"))
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            "XDG_CACHE_HOME": str(workdir / "cache"),
        }
        common = ["--inventory", str(config), "--node", "n1", "--json"]
        subprocess.run(  # validates the inventory once and snapshots it, as on a node
            [str(medic), "node", "run", f"bench-{token}", "show", *common],
            capture_output=True,
            check=True,
            env=env,
        )
        opened = statistics.median(session_cpu(medic, config, env, []) for _ in range(5))
        print(
            f"opening a helper session (start, imports, hello; median of 5): {opened * 1000:.1f} ms"
        )
        print(
            f"{'helper':<18}{'exit':>5}{'fresh ms':>10}{'forked ms':>11}{'ratio':>8}"
            f"{'session ms':>12}{'ratio':>8}"
        )
        for name, words in HELPERS.items():
            argv = ["node", *(w.format(model=f"bench-{token}") for w in words), *common]
            # Its exit status, so a helper that stopped early is not timed as a light one.
            once = subprocess.run(
                [str(medic), *argv], capture_output=True, text=True, check=False, env=env
            )
            if once.returncode not in (0, 1) or '"schema"' not in once.stdout:
                raise RuntimeError(f"{name}: exit {once.returncode}: {once.stderr.strip()}")
            fresh = statistics.median(measure(python, "fresh", args.repetitions, argv, env))
            forked = statistics.median(measure(python, "forked", args.repetitions, argv, env))
            # per call through a session: all of one session's CPU, less its opening
            spent = session_cpu(medic, config, env, [argv] * args.repetitions)
            per_call = (spent - opened) / args.repetitions
            print(
                f"{name:<18}{once.returncode:>5}{fresh * 1000:>10.1f}{forked * 1000:>11.1f}"
                f"{forked / fresh:>8.2f}{per_call * 1000:>12.1f}{per_call / fresh:>8.2f}",
                flush=True,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()[0]
    print(
        f"\n{args.repetitions} runs each way, medians of CPU (user + system) per helper;"
        f" Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
