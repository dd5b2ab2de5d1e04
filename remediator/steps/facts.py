"""What `mlx-medic node facts MODEL` tells about a node, as the playbook reads it.

Why here: the preflight reads memory and RDMA ports, the fallback reads whether the
service log or the serve wrapper's record shows a JACCL failure, and every escalation
carries what maintainers ask for in upstream issues (OS build, MLX and mlx-lm versions,
the exact error line, which host). One reading of the document serves them all.

The keys read (`docs/node-helpers.md`; anything missing reads as unknown, never as a
failure): `os.build`; `versions.mlx`, `versions.mlx-lm`; `memory.available_bytes`;
`rdma.ports: [{device, port, state, active}]` (`rdma` null: no RDMA on the node);
`log_errors: [{file, signature, line, offset}]` (recent error signatures of the model's
log files, with the exact line and the byte it starts at); `log_sizes: {file: bytes}`;
and, where a document carries it, `serve: {state, backend, failed_starts,
failed_backends, failure: {backend, host, reason, line}}` (the serve wrapper's record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlx_medic.node.log_marks import written_after
from mlx_medic.remediator.steps.base import RunContext
from mlx_medic.remediator.steps.on_nodes import NodeReplies, ask, document_list
from mlx_medic.serve.record import LIVE_STATES

JACCL_SIGNATURE_PREFIX = "jaccl_"  # mlx_medic.signatures: every JACCL failure's name


def _text(value: Any) -> str | None:
    return str(value) if isinstance(value, str | int | float) and str(value) else None


def _mapping(document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key)
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ErrorLine:
    signature: str
    line: str
    host: str
    file: str | None = None  # a service log's line: where, and the byte offset it starts at
    offset: int | None = None


@dataclass(frozen=True)
class NodeFacts:
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

    @classmethod
    def read(cls, node: str, document: dict[str, Any]) -> NodeFacts:
        versions, memory = _mapping(document, "versions"), _mapping(document, "memory")
        ports = [
            (
                f"{p.get('device', '?')}:{p.get('port', '?')}",
                p["active"] if isinstance(p.get("active"), bool) else None,
            )
            for p in document_list(_mapping(document, "rdma"), "ports")
        ]
        errors = [
            ErrorLine(
                str(e.get("signature", "")),
                str(e.get("line", "")),
                node,
                str(e["file"]) if isinstance(e.get("file"), str) else None,
                _number(e.get("offset")),
            )
            for e in document_list(document, "log_errors")
            if e.get("line")
        ]
        serve = _mapping(document, "serve")
        failure = _mapping(serve, "failure")
        serve_failure = None
        if failure:
            serve_failure = ErrorLine(
                f"{failure.get('backend', '?')} start failed: {failure.get('reason', '?')}",
                str(failure.get("line") or failure.get("reason") or ""),
                str(failure.get("host") or node),
            )
        return cls(
            node,
            _text(_mapping(document, "os").get("build")),
            _text(versions.get("mlx")),
            _text(versions.get("mlx-lm")),
            _number(memory.get("available_bytes")),
            ports,
            errors,
            serve_failure,
            _text(serve.get("backend")),
            _text(serve.get("state")),
            _number(serve.get("failed_starts")),
            tuple(str(b) for b in serve.get("failed_backends") or () if isinstance(b, str)),
            {str(k): _number(v) for k, v in _mapping(document, "log_sizes").items()},
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

    def jaccl_error_after(self, marks: dict[str, int | None]) -> ErrorLine | None:
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


def read_facts(replies: NodeReplies) -> dict[str, NodeFacts]:
    """The facts of every node that answered with a document (its exit status aside)."""
    return {node: NodeFacts.read(node, reply.document) for node, reply in replies.replies.items()}


def for_maintainers(facts: dict[str, NodeFacts], unanswered: list[str] | None = None) -> str:
    """What upstream maintainers ask for: each node's OS build and versions, and the exact
    error line with its host."""
    lines = [f.summary() for f in facts.values()]
    errors = [e for f in facts.values() if (e := f.jaccl_failure() or f.first_error())]
    lines += [f"error on {e.host}: {e.line}" for e in errors]
    lines += [f"{node}: no facts (did not answer)" for node in unanswered or []]
    return "; ".join(lines)


async def maintainers_report(context: RunContext, nodes: list[str]) -> str:
    """Ask `facts` on the nodes (at once) and say what maintainers ask for; a node that
    does not answer is named, never waited on past the helpers' timeout."""
    replies = await ask(context, nodes, "facts", context.model.name)
    return for_maintainers(read_facts(replies), list(replies.errors))
