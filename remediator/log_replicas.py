"""The journals `mlx-medic log` reads, and the replica each is from: the service's own
(its config's), or `--journal` files of remediator replicas, read together, read-only.

Two replicas each journal the same alerts; the model lock on the head lets one act, and
the other's run ends `locked` naming its peer. Read together, each run, decision and
control says its replica, and a run is `REPLICA#ID`: run ids are per journal.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mlx_medic.remediator.cli_common import CliError
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.journal.reads import JournalReads

T = TypeVar("T")


@dataclass(frozen=True)
class Replica:
    """A journal read, and the name shown for it: the host of its runs' owner, or its
    file name when another journal read has that host too or it has no run."""

    path: Path
    journal: JournalReads
    name: str
    merged: bool = False  # read with others: its runs are named `NAME#ID`

    def run_name(self, run_id: int) -> str:
        return f"{self.name if self.merged else ''}#{run_id}"

    def mark(self, record: dict[str, Any]) -> dict[str, Any]:
        """A record's JSON with the journal and the replica it is from."""
        return {**record, "journal": str(self.path), "replica": self.name}


def owner_host(journal: JournalReads) -> str | None:
    """The host of the newest run's owner (`host:pid`): the replica that writes it."""
    runs = journal.list_runs(limit=1)
    return (runs[0].owner.rpartition(":")[0] or None) if runs else None


def named(journals: Sequence[JournalReads]) -> list[Replica]:
    """Each journal with its replica's name; names unique (else its path, as given)."""
    hosts = [owner_host(j) for j in journals]
    names = [
        host if host and hosts.count(host) == 1 else j.path.name
        for host, j in zip(hosts, journals, strict=True)
    ]
    names = [
        n if names.count(n) == 1 else str(j.path) for n, j in zip(names, journals, strict=True)
    ]
    merged = len(journals) > 1
    return [Replica(j.path, j, n, merged) for j, n in zip(journals, names, strict=True)]


def open_journals(paths: Sequence[Path]) -> list[Replica]:
    """Each file read-only (nothing created or written); one named twice, missing,
    unreadable or no journal is a CliError naming it."""
    twice = [p for i, p in enumerate(paths) if p.resolve() in (q.resolve() for q in paths[:i])]
    if twice:
        raise CliError(f"--journal {twice[0]} is given twice")
    journals: list[JournalReads] = []
    try:
        for path in paths:
            try:
                journals.append(Journal(path, read_only=True))
            except OSError as exc:
                raise CliError(f"--journal {path}: cannot read it: {exc.strerror or exc}") from exc
            except sqlite3.Error as exc:
                raise CliError(f"--journal {path}: cannot read it as a journal: {exc}") from exc
        return named(journals)
    except BaseException:
        for journal in journals:
            journal.close()
        raise


def merged(
    replicas: Sequence[Replica],
    read: Callable[[JournalReads], list[T]],
    time: Callable[[T], float],
    *,
    newest_first: bool = True,
) -> list[tuple[Replica, T]]:
    """What `read` gives of each journal (each in its own order, by `time`), interleaved
    by `time`; of one journal, as it is."""
    return list(
        heapq.merge(
            *([(replica, item) for item in read(replica.journal)] for replica in replicas),
            key=lambda pair: time(pair[1]),
            reverse=newest_first,
        )
    )
