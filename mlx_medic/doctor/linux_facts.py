"""What the project assumes Linux shows: /proc/<pid>/stat as the exporter's own process
table reads it (mlx_medic/platform/proc_linux.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from mlx_medic.doctor.framework import DoctorContext, Outcome, check, failed, passed
from mlx_medic.doctor.macos_facts import PASTE, state_counts
from mlx_medic.platform.proc_linux import STATE_LETTERS, parse_stat


@check(
    "proc-states",
    ("linux",),
    "every /proc/<pid>/stat reads as `pid (comm) S ppid ...` with a state letter the"
    " exporter knows (`D`: uninterruptible)",
    elsewhere="Linux only: on macOS the exporter reads states from ps (ps-states)",
)
def proc_states(context: DoctorContext) -> Iterator[Outcome]:
    root = context.proc_root
    letters: list[str] = []
    unread: list[str] = []
    for name in sorted(n for n in os.listdir(root) if n.isdigit()):
        try:
            raw = (root / name / "stat").read_bytes()
        except OSError:
            continue  # gone since the listing
        try:
            stat = parse_stat(raw)
        except ValueError as exc:
            unread.append(f"{name}: {exc}")
            continue
        if stat.letter not in STATE_LETTERS:
            unread.append(f"{name}: state {stat.letter!r}")
        letters.append(stat.letter)
    if unread or not letters:
        yield failed(
            f"{len(unread)} processes' stat the exporter does not read, e.g. {unread[0]}"
            if unread
            else f"no process in {root}",
            f"{PASTE} (mlx_medic/platform/proc_linux.py)",
        )
        return
    yield passed(f"{len(letters)} processes, states {state_counts(letters)}")
