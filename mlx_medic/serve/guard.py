"""The rank guard: ends a rank (or the head's mlx.launch) once its run is over, even when
the wrapper that started it was SIGKILLed and could not say so.

`python -m mlx_medic.serve.guard --model M --run R --state-dir D -- COMMAND...` forks a
watcher and then becomes COMMAND (exec: same pid, so mlx.launch's pid file, the sshd
session and the sweep all see the rank itself). The watcher starts afresh with the run
and rank variables removed from its environment, in a session of its own and with its
output in `<state_dir>/runs/<model>.guard.log`, so it is never mistaken for a rank and
never holds the rank's terminal open. It polls (macOS has no parent-death signal) this
node's records: once the run's lease has run out or the node's current run is another
one, it ends the process it watches: SIGTERM, a grace period, SIGKILL where the policy
allows, each only while psutil finds the pid still held by that process (its start
counted from boot, which a clock step does not move). It exits when that process is
gone. Each line of its log is stamped. A JACCL rank is registered on its node before it
starts (mlx_medic.node.rank_register): one that ends by no signal of ours is counted as
`vanished`, a spend of its devices' domains, by whoever sees it gone first (this watcher,
or a sweep).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

    from mlx_medic.state.ledger import EntryKind

# The guard sits on every launch's critical path (before mlx.launch on the head, before
# each rank): what only its watcher needs is imported there, after the fork.

POLL = 1.0  # seconds between looks at the lease
START_TOLERANCE = 0.5  # seconds: psutil's start times of one process agree closely


def guard_argv(
    python: str,
    *,
    model: str,
    run_id: str,
    state_dir: Path,
    grace: float,
    sigkill: bool,
    backend: str,
    python_args: bool,
    smoke: bool = False,
) -> list[str]:
    """The guard's own words, to put before `-- COMMAND` (for `mlx.launch --python P`,
    leave out `python`: mlx.launch puts the interpreter first itself)."""
    argv = [
        *([python] if python else []),
        "-m",
        "mlx_medic.serve.guard",
        "--model",
        model,
        "--run",
        run_id,
        "--state-dir",
        str(state_dir),
        "--grace",
        f"{grace:g}",
        "--backend",
        backend,
    ]
    if not sigkill:
        argv.append("--no-sigkill")
    if python_args:
        argv.append("--python-args")
    if smoke:
        argv.append("--smoke")
    return [*argv, "--"]


def run_is_over(state_dir: Path, model: str, run_id: str, now: float) -> str | None:
    """Why the run's processes must end on this node, or None while its lease holds."""
    from mlx_medic.state.files import StateFileError
    from mlx_medic.state.runs import read_current_run, read_lease

    current = read_current_run(state_dir, model)
    if current != run_id:
        return f"the node's current run is {current or 'none'}, not {run_id}"
    try:
        lease = read_lease(state_dir, model)
    except StateFileError as exc:
        return f"the lease cannot be read ({exc})"
    if lease is None:
        return "no lease is recorded"
    if lease.run_id != run_id:
        return f"the lease is run {lease.run_id}'s"
    if lease.expired(now):
        return f"the lease ran out {now - lease.expires_at:.1f}s ago (holder: {lease.holder})"
    return None


def start_time(pid: int) -> float | None:
    """The process's start (seconds since the epoch); None when it is gone or a zombie."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(process.create_time())
    except psutil.Error:
        return None


def watched_process(pid: int, started: float) -> psutil.Process | None:
    """The process the guard became, once its start is checked against the one the guard
    read; None when that process is gone. From then on psutil tells it from a process that
    reuses its pid by its start counted from boot, which a clock step does not move (the
    start in seconds since the epoch moves with the clock on Linux)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - started) > START_TOLERANCE:
            return None
    except psutil.Error:
        return None
    return process if alive(process) else None


def alive(process: psutil.Process) -> bool:
    """Still the watched process, and not a zombie."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end_process(process: psutil.Process, grace: float, sigkill: bool) -> bool:
    """SIGTERM, up to `grace` seconds, then SIGKILL if allowed, each only while the pid
    is still that process. True when SIGKILL was sent."""
    import psutil

    try:
        process.terminate()  # psutil signals only the process it was made for
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not alive(process):
                return False
            time.sleep(0.1)
        if sigkill and alive(process):
            process.kill()
            return True
    except psutil.Error:  # gone (or its pid reused) in between
        pass
    return False


def record_spend_of(
    state_dir: Path,
    model: str,
    pid: int,
    started: float,
    kind: EntryKind,
    devices: tuple[str, ...],
) -> None:
    """A SIGKILLed (or vanished) JACCL rank spends its devices' domains until reboot."""
    from mlx_medic.state.ledger import record_spend
    from mlx_medic.state.node_identity import read_node_id

    node = read_node_id(state_dir)
    if node is not None:
        record_spend(
            state_dir,
            node,
            kind,
            pid=pid,
            start_time=started,
            devices=devices,
            model=model,
        )


def say(message: str) -> None:
    """One line of the guard log, stamped: on-call reads how long the guard took."""
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} guard: {message}", flush=True)


def watch(args: argparse.Namespace) -> int:
    devices = tuple(d for d in args.devices.split(",") if d)
    process = watched_process(args.pid, args.start)
    if process is None:
        say(f"pid {args.pid} of run {args.run} was gone before its watch began")
    else:
        say(f"watching pid {args.pid} of run {args.run}")
    while process is not None and alive(process):
        why = run_is_over(args.state_dir, args.model, args.run, time.time())
        if why is not None:
            say(f"ending pid {args.pid} of run {args.run}: {why}")
            killed = end_process(process, args.grace, args.sigkill)
            if killed and args.backend == "jaccl":
                record_spend_of(
                    args.state_dir, args.model, args.pid, args.start, "sigkill", devices
                )
            return 0
        time.sleep(POLL)
    if args.backend == "jaccl":
        count_vanished(args.state_dir)
    return 0


def count_vanished(state_dir: Path) -> None:
    """The rank is gone: count it (and any other gone rank here) unless a signal of ours
    ended it."""
    from mlx_medic.node.rank_register import count_gone
    from mlx_medic.state.node_identity import read_node_id

    node = read_node_id(state_dir)
    if node is None:
        return
    for rank in count_gone(state_dir, node):
        say(
            f"JACCL rank pid {rank.pid} of run {rank.run_id} ended without a signal"
            " of ours: counted as a spend (vanished)"
        )


def own_devices() -> tuple[str, ...]:
    """This rank's RDMA devices, from the JACCL environment mlx.launch gave it."""
    from mlx_medic.processes.placement import rank_devices

    def read(path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    return rank_devices(os.environ, read)


def _watcher(args: argparse.Namespace, pid: int, started: float, devices: tuple[str, ...]) -> None:
    """In the forked child: detach and exec the watcher with a clean environment."""
    try:
        os.setsid()
        log_path = Path(args.state_dir) / "runs" / f"{args.model}.guard.log"
        from mlx_medic.state.layout import FILE_MODE, ensure_dir

        ensure_dir(log_path.parent)
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        from mlx_medic.processes.info import WATCHED_ENV

        env = {k: v for k, v in os.environ.items() if k not in WATCHED_ENV}
        argv = [
            sys.executable,
            "-I",
            "-m",
            "mlx_medic.serve.guard",
            "--watch",
            str(pid),
            "--start",
            repr(started),
            "--model",
            args.model,
            "--run",
            args.run,
            "--state-dir",
            str(args.state_dir),
            "--grace",
            f"{args.grace:g}",
            "--backend",
            args.backend,
            "--devices",
            ",".join(devices),
            *([] if args.sigkill else ["--no-sigkill"]),
        ]
        os.execve(sys.executable, argv, env)
    finally:
        os._exit(70)  # only reached when exec failed


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m mlx_medic.serve.guard", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--no-sigkill", dest="sigkill", action="store_false")
    parser.add_argument(
        "--backend",
        default="none",
        help="the rank's backend: a SIGKILLed jaccl rank is a ledger spend;"
        " none for mlx.launch itself",
    )
    parser.add_argument(
        "--python-args",
        action="store_true",
        help="COMMAND is this interpreter's arguments (`-m mlx_lm server`)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="COMMAND is a smoke test's rank: it records its own outcome, and"
        " mlx.launch ends the others when one fails, so its end is not"
        " counted as vanished",
    )
    parser.add_argument("--devices", default="", help=argparse.SUPPRESS)
    parser.add_argument("--watch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.watch is None and not command:
        parser.error("give the command to guard after `--`")
    return args, command


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    if args.watch is not None:
        args.pid = args.watch
        return watch(args)
    pid = os.getpid()
    started = start_time(pid)
    if started is None:
        print("guard: cannot read this process's start time", file=sys.stderr)
        return 70
    devices = own_devices() if args.backend == "jaccl" else ()
    if args.backend == "jaccl" and not args.smoke:
        from mlx_medic.node.rank_register import register

        register(
            args.state_dir,
            model=args.model,
            run_id=args.run,
            pid=pid,
            start_time=started,
            devices=devices,
        )
    if os.fork() == 0:
        _watcher(args, pid, started, devices)
    target = [sys.executable, *command] if args.python_args else command
    os.execvp(target[0], target)
    return 70  # not reached


if __name__ == "__main__":
    sys.exit(main())
