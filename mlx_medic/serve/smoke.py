"""The smoke test's rank program, and how its output is judged.

`python -m mlx_medic.serve.smoke --backend B --state-dir D --model M`, started on every
node by mlx.launch: initialise the backend, all-reduce a one, print one line that says
whether this rank got the sum, and exit. mlx.launch's exit status says nothing (it exits
0 when a rank failed), so the wrapper judges by these lines. A JACCL rank records on its
own node what it did: a failed start and a clean init and teardown are disputed cycles,
never debt (a failed allocation spends nothing; docs/decisions.md). `ibv_alloc_pd`
returns NULL on a port that is down too, with the same words (ml-explore/mlx PR #4530),
so on that error the rank reads its devices' port states first and reports a down port
as a link fault.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlx_medic.platform.macos_rdma import RdmaPort
    from mlx_medic.state.ledger import EntryKind

MARK = "mlx-medic smoke:"
OK_LINE = re.compile(rf"{re.escape(MARK)} rank (\d+) of (\d+) ok sum=(\d+)")
FAILED_LINE = re.compile(rf"{re.escape(MARK)} rank (\d+) failed: (.*)")
LAUNCH_RANK_LINE = re.compile(r"Node with rank (\d+) (exited with code -?\d+|was killed)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # mlx.launch colours its warnings
LAUNCH_ERROR_LINE = re.compile(r"mlx\.launch: error: (.*)|usage: mlx\.launch")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    host: str = ""
    reason: str = ""
    line: str = ""


def judge(output: str, nodes: list[str], timed_out: bool, limit: float) -> Verdict:
    """Every rank printed the full sum: ok. Else the first rank that said why it failed,
    else the rank mlx.launch saw end, else mlx.launch's own error, else the ranks that
    said nothing in time."""
    lines = [ANSI.sub("", line).strip() for line in output.splitlines()]
    ok = {
        int(m.group(1))
        for line in lines
        if (m := OK_LINE.search(line)) and int(m.group(3)) == len(nodes)
    }
    if ok == set(range(len(nodes))):
        return Verdict(True)

    def host(rank: int) -> str:
        return nodes[rank] if 0 <= rank < len(nodes) else f"rank {rank}"

    for line in lines:
        if m := FAILED_LINE.search(line):
            return Verdict(False, host(int(m.group(1))), m.group(2), line)
    for line in lines:
        if m := LAUNCH_ERROR_LINE.search(line):
            error = next((x for x in lines if "mlx.launch: error:" in x), line)
            return Verdict(False, nodes[0], f"mlx.launch refused to start: {error}", error)
    for line in lines:
        if (m := LAUNCH_RANK_LINE.search(line)) and int(m.group(1)) not in ok:
            return Verdict(False, host(int(m.group(1))), f"rank {m.group(1)} {m.group(2)}", line)
    silent = [host(rank) for rank in range(len(nodes)) if rank not in ok]
    tail = next((x for x in reversed(lines) if x), "")
    if timed_out:
        return Verdict(
            False,
            ", ".join(silent),
            f"no all-reduce within {limit:g}s (ranks {', '.join(silent)} silent)",
            tail,
        )
    return Verdict(False, ", ".join(silent), "the smoke test ended without every rank's sum", tail)


def _record(state_dir: Path, model: str, kind: EntryKind) -> None:
    from mlx_medic.model_lock import process_start_time
    from mlx_medic.state.ledger import record_spend
    from mlx_medic.state.node_identity import read_node_id

    node = read_node_id(state_dir)
    started = process_start_time(os.getpid())
    if node is None or started is None:
        print(
            f"{MARK} cannot record {kind} in the ledger: no node-id in {state_dir}", file=sys.stderr
        )
        return
    record_spend(
        state_dir,
        node,
        kind,
        pid=os.getpid(),
        start_time=started,
        model=model,
    )


PD_ERROR = "Couldn't allocate protection domain"


def link_fault(devices: tuple[str, ...], read_ports: Callable[[], list[RdmaPort] | None]) -> str:
    """ " (link fault: rdma_en3 port 1 PORT_DOWN ...)" for this rank's devices whose port is
    not active; "" when every port is up or the states cannot be read here."""
    try:
        ports = read_ports()
    except Exception:  # a broken probe says nothing about the link
        return ""
    down = [p for p in ports or () if (not devices or p.device in devices) and not p.active]
    if not down:
        return ""
    named = ", ".join(f"{p.device} port {p.port} {p.state}" for p in down)
    return (
        f" (link fault: {named}; ibv_alloc_pd fails on a down port with the same words,"
        " so no protection domain is short: reseat the cable)"
    )


def read_ibv_ports() -> list[RdmaPort] | None:
    """The port states `ibv_devinfo` prints; None where it is not installed (Linux)."""
    from mlx_medic.platform.commands import run_command
    from mlx_medic.platform.macos_rdma import IBV_DEVINFO_ARGV, parse_ibv_devinfo, rdma_tool_output

    text = rdma_tool_output(run_command, IBV_DEVINFO_ARGV, 10.0)
    return None if text is None else parse_ibv_devinfo(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlx_medic.serve.smoke")
    parser.add_argument("--backend", required=True, choices=["ring", "jaccl"])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    rank = os.environ.get("MLX_RANK", "?")
    try:
        import mlx.core as mx

        group = mx.distributed.init(backend=args.backend, strict=True)
        total = mx.distributed.all_sum(mx.ones(1), group=group)
        mx.eval(total)
    except Exception as exc:  # the reason is the verdict: print it, whatever it is
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        if args.backend == "jaccl" and PD_ERROR in reason:
            from mlx_medic.serve.guard import own_devices

            reason += link_fault(own_devices(), read_ibv_ports)
        print(f"{MARK} rank {rank} failed: {reason}", flush=True)
        if args.backend == "jaccl":
            _record(args.state_dir, args.model, "failed_start")
        return 1
    summed = round(float(total.item()))  # type: ignore[arg-type]
    print(f"{MARK} rank {group.rank()} of {group.size()} ok sum={summed}", flush=True)
    if args.backend == "jaccl":
        _record(args.state_dir, args.model, "init_teardown")
    return 0


if __name__ == "__main__":
    sys.exit(main())
