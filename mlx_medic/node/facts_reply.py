"""What `mlx-medic node facts MODEL` tells a caller about a node (`FactsReply`).

Why one reading: the preflight reads memory and RDMA ports, the fallback and the verify
read whether the service log or the serve wrapper's record shows a JACCL failure, and
every escalation carries what maintainers ask for in upstream issues (OS build, MLX and
mlx-lm versions, the exact error line, which host).

The fields read (`docs/node-helpers.md`; every one unknown when missing or ill-typed,
never a failure: mlx_medic.node.replies): `os.build`; `versions.mlx`, `versions.mlx-lm`;
`memory.available_bytes`; `rdma.ports: [{device, port, state, active}]` (`rdma` null: no
RDMA on the node); `log_errors: [{file, signature, line, offset}]` (recent error
signatures of the model's log files, with the exact line and the byte it starts at);
`log_sizes: {file: bytes}`; and, where a document carries it, `serve: {state, backend,
failed_starts, failed_backends, failure: {backend, host, reason, line}}` (the serve
wrapper's record); `boot: {id, booted_at, survivors: [{pid, model, backend, devices,
domains}]}` (this boot's id, when it began, and the ledger's live survivors of SIGKILL);
`drain: {by, since, models}` (the node's drain record, null when not drained).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Self

from mlx_medic.node.log_marks import written_after
from mlx_medic.node.replies import Fields, Reply
from mlx_medic.serve.record import LIVE_STATES

JACCL_SIGNATURE_PREFIX = "jaccl_"  # mlx_medic.signatures: every JACCL failure's name


@dataclass(frozen=True)
class ErrorLine:
    signature: str
    line: str
    host: str
    file: str | None = None  # a service log's line: where, and the byte offset it starts at
    offset: int | None = None


@dataclass(frozen=True)
class BootSurvivor:
    """A survivor of SIGKILL this boot's ledger records on the node, still alive: the
    protection domains it holds until the node reboots."""

    pid: int
    model: str | None
    backend: str | None
    devices: tuple[str, ...]
    domains: int


@dataclass(frozen=True)
class FactsReply(Reply):
    helper: ClassVar[str] = "facts"
    node: str
    os_build: str | None = None
    mlx: str | None = None
    mlx_lm: str | None = None
    memory_available: int | None = None
    # (device:port, active): the helper's `active`, None where it did not say
    rdma_ports: list[tuple[str, bool | None]] = field(default_factory=list)
    errors: list[ErrorLine] = field(default_factory=list)
    serve_failure: ErrorLine | None = None  # the wrapper's record of a failed backend
    serve_backend: str | None = None
    serve_state: str | None = None
    serve_failed_starts: int | None = None  # the wrapper's count of failed starts
    serve_failed_backends: tuple[str, ...] = ()  # of its last failed start
    log_sizes: dict[str, int | None] = field(default_factory=dict)
    boot_id: str | None = None  # this boot's; None from a helper that does not say
    survivors: tuple[BootSurvivor, ...] = ()  # of SIGKILL, alive, by this boot's ledger
    booted_at: float | None = None  # Unix time this boot began; None: not said
    drained_by: str | None = None  # the node's drain record (`mlx-medic drain`): who

    @classmethod
    def parse(cls, node: str, document: Fields) -> Self:
        versions, memory = document.obj("versions"), document.obj("memory")
        ports = [
            (f"{p.text('device') or '?'}:{p.text('port') or '?'}", p.flag("active"))
            for p in document.obj("rdma").objects("ports")
        ]
        errors = [
            ErrorLine(
                e.text("signature") or "",
                e.text("line") or "",
                node,
                e.text("file") if isinstance(e.data.get("file"), str) else None,
                e.number("offset"),
            )
            for e in document.objects("log_errors")
            if e.data.get("line")
        ]
        serve = document.obj("serve")
        failure = serve.obj("failure")
        serve_failure = None
        if failure:
            serve_failure = ErrorLine(
                f"{failure.text('backend') or '?'} start failed: {failure.text('reason') or '?'}",
                failure.text("line") or failure.text("reason") or "",
                failure.text("host") or node,
            )
        return cls(
            node,
            document.obj("os").text("build"),
            versions.text("mlx"),
            versions.text("mlx-lm"),
            memory.number("available_bytes"),
            ports,
            errors,
            serve_failure,
            serve.text("backend"),
            serve.text("state"),
            serve.number("failed_starts"),
            serve.strings("failed_backends"),
            document.sizes("log_sizes"),
            document.obj("boot").text("id"),
            tuple(
                BootSurvivor(
                    s.number("pid") or 0,
                    s.text("model"),
                    s.text("backend"),
                    s.strings("devices"),
                    s.number("domains") or 0,
                )
                for s in document.obj("boot").objects("survivors")
            ),
            document.obj("boot").real("booted_at"),
            document.obj("drain").text("by"),
        )

    @property
    def serving_backend(self) -> str | None:
        """The backend a live serve wrapper (starting or serving) runs the model on."""
        return self.serve_backend if self.serve_state in LIVE_STATES else None

    @property
    def inactive_ports(self) -> list[str]:
        return [name for name, active in self.rdma_ports if active is False]

    @property
    def unknown_ports(self) -> list[str]:
        return [name for name, active in self.rdma_ports if active is None]

    def jaccl_failure(self) -> ErrorLine | None:
        """The line that shows JACCL failed here: the wrapper's record of a failed JACCL
        start first, else the latest JACCL signature in the service log; None if none."""
        failure = self.serve_failure
        if failure is not None and failure.signature.startswith("jaccl"):
            return failure
        jaccl = [e for e in self.errors if e.signature.startswith(JACCL_SIGNATURE_PREFIX)]
        return jaccl[-1] if jaccl else None

    def jaccl_error_after(self, marks: Mapping[str, int | None]) -> ErrorLine | None:
        """The latest JACCL line of the service log written after `marks` (where each log
        ended before a start, `node service start`'s `log_sizes`); None if none."""
        for error in reversed(self.errors):
            if error.signature.startswith(JACCL_SIGNATURE_PREFIX) and written_after(
                error.file, error.offset, marks, self.log_sizes
            ):
                return error
        return None

    def jaccl_start_failed_after(self, failed_starts: int | None) -> ErrorLine | None:
        """The serve wrapper's failure when it counted a failed start since
        `failed_starts` (None: it had no record then) and every backend that start tried
        was JACCL; None otherwise."""
        if self.serve_failed_starts is None or self.serve_failed_starts <= (failed_starts or 0):
            return None
        if not self.serve_failed_backends or set(self.serve_failed_backends) != {"jaccl"}:
            return None
        return self.serve_failure

    def first_error(self) -> ErrorLine | None:
        return self.serve_failure or (self.errors[-1] if self.errors else None)

    def summary(self) -> str:
        """For an escalation: `ai002: macOS build 24G84, mlx 0.29.1, mlx-lm 0.28.0`."""
        parts = [
            f"OS build {self.os_build or 'unknown'}",
            f"mlx {self.mlx or 'unknown'}",
            f"mlx-lm {self.mlx_lm or 'unknown'}",
        ]
        return f"{self.node}: {', '.join(parts)}"
