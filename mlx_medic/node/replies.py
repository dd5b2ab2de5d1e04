"""What a caller reads in a node helper's JSON document: one frozen type per helper
(`FactsReply` in facts_reply.py, `SweepReply` in sweep_reply.py, the small ones here),
read once where the reply arrives (`mlx_medic.node.client`), so the remediator's steps
and the serve wrapper read fields, never keys. Only callers import these; a helper on
the node writes its document and never reads one back.

How a document that is not as the helper writes it reads, one rule for every reply
(`Fields`):
- a field that is missing, null or of another type reads as unknown: None, empty, or the
  default its type names (an older helper, a part the node could not read);
- except what a caller acts on: a process's `pid` (a whole number; its `start_time` a
  number when given), the backend `choice` and a pid's `liveness`. Without it the
  document is garbage: `ReplyError` names the field, and the client makes it a
  HelperCallError that names the node and the helper too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from mlx_medic.processes.pid_liveness import Liveness
from mlx_medic.state.backend_choice import CHOICES, BackendChoice
from mlx_medic.state.service_stop import ServiceStop


class ReplyError(ValueError):
    """A field a caller acts on is missing or not what the helper writes."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name} {why}")
        self.field = name


def _number(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Fields:
    """One JSON object of a document, read by the module's rule; `at` is where it sits in
    the document (`unkillable[0]`), for the error that names a field."""

    data: Mapping[str, Any]
    at: str = ""

    @classmethod
    def of(cls, value: Any, at: str = "") -> Fields:
        """An object, or an empty one for anything else (unknown)."""
        return cls(value if isinstance(value, Mapping) else {}, at)

    def __bool__(self) -> bool:
        return bool(self.data)

    def name(self, key: str) -> str:
        return f"{self.at}.{key}" if self.at else key

    def text(self, key: str) -> str | None:
        value = self.data.get(key)
        return str(value) if isinstance(value, str | int | float) and str(value) else None

    def number(self, key: str) -> int | None:
        return _number(self.data.get(key))

    def real(self, key: str) -> float | None:
        value = self.data.get(key)
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )

    def flag(self, key: str) -> bool | None:
        value = self.data.get(key)
        return value if isinstance(value, bool) else None

    def obj(self, key: str) -> Fields:
        return Fields.of(self.data.get(key), self.name(key))

    def objects(self, key: str) -> list[Fields]:
        """A list's objects (anything else in it is skipped); a list of nothing when the
        field is not a list."""
        value = self.data.get(key)
        if not isinstance(value, list):
            return []
        where = self.name(key)
        return [Fields(v, f"{where}[{i}]") for i, v in enumerate(value) if isinstance(v, Mapping)]

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

    def sizes(self, key: str) -> dict[str, int | None]:
        """An object of numbers (`log_sizes`: file -> bytes), each not a number unknown."""
        return {str(k): _number(v) for k, v in self.obj(key).data.items()}

    def pid(self) -> int:
        """The process's pid: a caller signals and names processes by it (required)."""
        pid = self.data.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise ReplyError(self.name("pid"), f"is {pid!r}, not a pid")
        return pid

    def start_time(self) -> float:
        """When the process started (with its pid, which process it is); 0.0 unknown."""
        value, start_time = self.data.get("start_time"), self.real("start_time")
        if start_time is None and value is not None:
            raise ReplyError(self.name("start_time"), f"is {value!r}, not a time")
        return start_time or 0.0


class Reply:
    """One helper's document as a caller reads it (`helper`: whose)."""

    helper: ClassVar[str]

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        """The reply from `node`'s document; ReplyError naming a field it cannot be."""
        raise NotImplementedError


@dataclass(frozen=True)
class ProcessEntry:
    """A process as a helper names it (the sweep's `signalled`, `survivors`, `spared`,
    `not_ours` and `serving_listener`, the orphans' `orphans` and `suspects`): each list
    carries some of these fields, the others read as unknown."""

    pid: int
    start_time: float = 0.0
    cmdline: tuple[str, ...] = ()
    role: str = "?"
    state: str = "?"
    rule: str | None = None  # the orphan rule (orphans), the sweep's rule (signalled)
    owner: str = "?"  # not_ours: whose it is
    holds_port: bool = False  # not_ours: it listens on the model's port

    @property
    def identity(self) -> tuple[int, float]:
        """Pid and start time: a reused pid is another process."""
        return self.pid, self.start_time

    @classmethod
    def read(cls, entry: Fields) -> ProcessEntry:
        return cls(
            entry.pid(),
            entry.start_time(),
            entry.strings("cmdline"),
            entry.text("role") or "?",
            entry.text("state") or "?",
            entry.text("rule"),
            entry.text("owner") or "?",
            bool(entry.flag("holds_port")),
        )

    @classmethod
    def read_all(cls, document: Fields, key: str) -> tuple[ProcessEntry, ...]:
        return tuple(cls.read(entry) for entry in document.objects(key))


@dataclass(frozen=True)
class PathEntry:
    """A tmp entry as the clean names it (`removed`, `not_ours`)."""

    path: str | None
    owner: str = "?"  # not_ours: whose it is


@dataclass(frozen=True)
class CleanReply(Reply):
    """`node clean MODEL`: what it removed, the bytes freed, the entries not ours."""

    helper: ClassVar[str] = "clean"
    removed: tuple[PathEntry, ...] = ()
    bytes_freed: int = 0
    not_ours: tuple[PathEntry, ...] = ()

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        def entries(key: str) -> tuple[PathEntry, ...]:
            return tuple(
                PathEntry(e.text("path"), e.text("owner") or "?") for e in document.objects(key)
            )

        return cls(entries("removed"), document.number("bytes_freed") or 0, entries("not_ours"))


@dataclass(frozen=True)
class ServiceReply(Reply):
    """`node service MODEL ACTION`: the manager command's own exit status and output
    (None: it did not run or finish), the head's stop record, and, after a start, where
    the head stood just before it (`log_sizes`, the serve wrapper's `failed_starts`)."""

    helper: ClassVar[str] = "service"
    exit_status: int | None = None
    stdout: str = ""
    stderr: str = ""
    stopped_by: ServiceStop | None = None  # {run, at, reason}: who left it stopped
    log_sizes: dict[str, int | None] = field(default_factory=dict)
    failed_starts: int | None = None
    replaced: ServiceStop | None = None  # a stop's: the record it found, another run's

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        return cls(
            document.number("exit_status"),
            document.text("stdout") or "",
            document.text("stderr") or "",
            _service_stop(document.obj("stopped_by")),
            document.sizes("log_sizes"),
            document.number("failed_starts"),
            _service_stop(document.obj("replaced")),
        )


@dataclass(frozen=True)
class RebootReply(Reply):
    """`node reboot`: the argv it ran (the inventory's reboot command, through `sudo -n`),
    the command's exit status (None: it did not run) and the end of its stderr."""

    helper: ClassVar[str] = "reboot"
    argv: tuple[str, ...] = ()
    exit_status: int | None = None
    stderr: str = ""

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        return cls(
            document.strings("argv"),
            document.number("exit_status"),
            document.text("stderr") or "",
        )


def _service_stop(record: Fields) -> ServiceStop | None:
    """A stop record in a document, or None (null, or no run named)."""
    run = record.text("run")
    if run is None:
        return None
    return ServiceStop(run, record.real("at") or 0.0, record.text("reason") or "")


@dataclass(frozen=True)
class BackendReply(Reply):
    """`node backend MODEL show|set`: the model's backend choice on its head."""

    helper: ClassVar[str] = "backend"
    choice: BackendChoice

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        choice = document.text("choice")
        if choice not in CHOICES:
            raise ReplyError("choice", f"is {choice!r}, not one of {', '.join(CHOICES)}")
        boots = {str(k): str(v) for k, v in document.obj("boots").data.items()}
        return cls(
            BackendChoice(
                choice,  # type: ignore[arg-type]  # one of CHOICES, checked above
                document.text("by") or "",
                document.real("at") or 0.0,
                document.text("reason") or "",
                boots,
            )
        )


@dataclass(frozen=True)
class OrphansReply(Reply):
    """`node orphans [MODEL]`: the node's orphans (by the exporter's rules) and suspects."""

    helper: ClassVar[str] = "orphans"
    orphans: tuple[ProcessEntry, ...] = ()
    suspects: tuple[ProcessEntry, ...] = ()

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        return cls(
            ProcessEntry.read_all(document, "orphans"), ProcessEntry.read_all(document, "suspects")
        )


@dataclass(frozen=True)
class RunReply(Reply):
    """`node run MODEL show|set|renew|clear`: the model's current run on the node, and why
    a renewal or clear was refused (another run is current)."""

    helper: ClassVar[str] = "run"
    current: str | None = None
    refused: str | None = None

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        return cls(document.text("current"), document.text("refused"))


@dataclass(frozen=True)
class PidAliveReply(Reply):
    """`node pid-alive PID`: whether a lock holder's pid lives there, and why it says so.
    The liveness decides whether a lock is broken, so it must be one the helper writes."""

    helper: ClassVar[str] = "pid-alive"
    liveness: Liveness
    why: str = ""

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        said = document.text("liveness")
        if said not in {member.value for member in Liveness}:
            named = ", ".join(member.value for member in Liveness)
            raise ReplyError("liveness", f"is {said!r}, not one of {named}")
        return cls(Liveness(said), document.text("why") or "")


@dataclass(frozen=True)
class RoomReply(Reply):
    """`node room MODEL`: available memory (capped by macOS's GPU wired limit when one is
    set), the weights held there (None: none) and the free bytes where they would be staged."""

    helper: ClassVar[str] = "room"
    available_bytes: int | None = None
    wired_limit_bytes: int | None = None
    memory_seam: str | None = None  # the testbed's seam supplied `available_bytes`
    weights: dict[str, int] | None = None  # relative file name -> bytes
    staging_dir: str | None = None
    staging_exists: bool = True
    free_bytes: int | None = None
    digests: dict[str, str] | None = None  # relative file name -> SHA-256 (asked with --sha256)

    @property
    def usable_memory(self) -> int | None:
        """What a rank may take: the available memory, at most the GPU's wired cap."""
        if self.available_bytes is None or self.wired_limit_bytes is None:
            return self.available_bytes
        return min(self.available_bytes, self.wired_limit_bytes)

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        memory, weights, staging = (
            document.obj("memory"),
            document.obj("weights"),
            document.obj("staging"),
        )
        files = weights.data.get("files")
        manifest = (
            {str(k): v for k, v in weights.sizes("files").items() if v is not None}
            if isinstance(files, Mapping)
            else None
        )
        return cls(
            memory.number("available_bytes"),
            memory.number("wired_limit_bytes"),
            memory.text("seam"),
            manifest,
            staging.text("dir"),
            staging.flag("exists") is not False,
            staging.number("free_bytes"),
            {str(k): str(v) for k, v in weights.obj("sha256").data.items() if isinstance(v, str)}
            if isinstance(weights.data.get("sha256"), Mapping)
            else None,
        )
