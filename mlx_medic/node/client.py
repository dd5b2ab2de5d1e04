"""Calling the node helpers from elsewhere: the remediator over SSH, the serve wrapper
on its head and peers.

One argv shape for every call, `<medic_command> node HELPER ARGS --inventory
<medic_config> --node NAME --json --time-limit SECONDS` (the call's own wait: past it the
helper ends itself on the node), which the forced command on the node accepts, and
one reading of the reply: the helper's JSON document and exit status, or an error that
says the node could not be asked (never read as the helper's answer). Called with the
helper's reply type (`call(node, SweepReply, ...)`, mlx_medic.node.replies), the document
is read into it here, once: a document that cannot be is a HelperCallError naming the
node, the helper and the field, never a KeyError in the caller. A node whose mlx-medic is
deployed wrong for the call (its inventory unreadable, mlx-medic missing, its forced
command refusing, another version) is a HelperMisconfigured: the same error, carrying what
is wrong and the fix as data (mlx_medic.node.misconfiguration).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.node.cli import EXIT_OK, SCHEMA
from mlx_medic.node.misconfiguration import (
    Misconfiguration,
    classify_document,
    classify_failure,
)
from mlx_medic.node.replies import Fields, Reply, ReplyError
from mlx_medic.transport import NodeTransport, TransportError


class HelperCallError(RuntimeError):
    """The helper's answer could not be had: the node was unreachable, the call timed out,
    or what came back is not a helper's document. `unreachable` and `timed_out` tell the
    first two apart (the node gave no answer) from the third (it answered, but not well)."""

    def __init__(
        self,
        node: str,
        helper: str,
        message: str,
        *,
        unreachable: bool = False,
        timed_out: bool = False,
    ):
        super().__init__(f"{node}: mlx-medic node {helper}: {message}")
        self.node = node
        self.helper = helper
        self.unreachable = unreachable
        self.timed_out = timed_out

    @property
    def no_answer(self) -> bool:
        return self.unreachable or self.timed_out


class HelperTimedOut(HelperCallError):
    """The helper gave no answer within `limit` seconds: hung or slow, not refused; it was
    sent the same limit and ends itself (and what it started) on the node past it."""

    def __init__(self, node: str, helper: str, limit: float):
        super().__init__(node, helper, f"no answer within {limit:g}s", timed_out=True)
        self.limit = limit


class HelperMisconfigured(HelperCallError):
    """The node answered, but its mlx-medic cannot serve this call as deployed: what is
    wrong, where and the one fix are `misconfiguration`; no retry changes it."""

    def __init__(self, helper: str, misconfiguration: Misconfiguration):
        super().__init__(misconfiguration.node, helper, str(misconfiguration))
        self.misconfiguration = misconfiguration


# Who calls, as a version mismatch names it ("n3 runs mlx-medic 0.3, this remediator 0.4")
ANY_CALLER = "this mlx-medic"
REMEDIATOR = "this remediator"


A = TypeVar("A")  # a reply's answer: a Reply, or None for a helper called by name
R = TypeVar("R", bound=Reply)


@dataclass(frozen=True)
class HelperReply(Generic[A]):
    """The helper's exit status, its raw document (what the journal records) and `answer`,
    the document read as the helper's reply type (None when called by the helper's name)."""

    node: str
    helper: str
    argv: list[str]
    exit_status: int
    document: dict[str, Any]
    answer: A
    stderr: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_status == EXIT_OK


def helper_argv(
    node: Node, helper: str, args: Sequence[str], time_limit: float | None = None
) -> list[str]:
    """The call's argv; with `time_limit`, the helper ends itself (and what it started)
    once the caller no longer waits for it (mlx_medic.node.cli.end_at_time_limit)."""
    limit = ["--time-limit", f"{time_limit:g}"] if time_limit is not None else []
    return [
        node.medic_command,
        "node",
        helper,
        *args,
        "--inventory",
        str(node.medic_config),
        "--node",
        node.name,
        "--json",
        *limit,
    ]


def parse_reply(
    node: str,
    helper: str,
    argv: list[str],
    exit_status: int | None,
    stdout: str,
    stderr: str,
    caller: str = ANY_CALLER,
) -> HelperReply:
    """The helper's document, or HelperCallError saying why there is none
    (HelperMisconfigured when the deployment is why: its kind, path and fix)."""
    if exit_status is None:
        raise HelperCallError(node, helper, f"ended by a signal ({stderr.strip()[-300:]})")
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        document = json.loads(lines[-1]) if lines else None
    except ValueError:
        document = None
    if isinstance(document, dict) and {"schema", "command"} <= document.keys():
        found = classify_document(node, document, caller)
        if found is not None:
            raise HelperMisconfigured(helper, found)
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        found = classify_failure(node, argv, exit_status, stderr, caller)
        if found is not None:
            raise HelperMisconfigured(helper, found)
        why = stderr.strip()[-500:] or stdout.strip()[-200:] or "no output"
        raise HelperCallError(node, helper, f"exit {exit_status}, no helper document: {why}")
    if document.get("command") != helper:
        raise HelperCallError(node, helper, f"answered as {document.get('command')!r}")
    return HelperReply(node, helper, argv, exit_status, document, None, stderr)


def read_as(reply: HelperReply[Any], kind: type[R]) -> HelperReply[R]:
    """The reply with its document read as `kind`; HelperCallError naming the node, the
    helper and the field when it cannot be (mlx_medic.node.replies: what is garbage)."""
    try:
        answer = kind.parse(reply.node, Fields(reply.document))
    except ReplyError as exc:
        raise HelperCallError(
            reply.node, reply.helper, f"exit {reply.exit_status}, the document's {exc}"
        ) from None
    return HelperReply(
        reply.node,
        reply.helper,
        reply.argv,
        reply.exit_status,
        reply.document,
        answer,
        reply.stderr,
    )


class NodeHelpers:
    """Run helpers on the inventory's nodes through a transport (local, SSH or routed)."""

    def __init__(
        self,
        transport: NodeTransport,
        inventory: Inventory,
        timeout: float,
        caller: str = ANY_CALLER,
    ):
        self.transport = transport
        self.inventory = inventory
        self.timeout = timeout
        self.caller = caller  # as a version mismatch names it: "this remediator"

    @overload
    async def call(
        self, node_name: str, helper: type[R], *args: str, timeout: float | None = None
    ) -> HelperReply[R]: ...

    @overload
    async def call(
        self, node_name: str, helper: str, *args: str, timeout: float | None = None
    ) -> HelperReply[None]: ...

    async def call(
        self, node_name: str, helper: type[R] | str, *args: str, timeout: float | None = None
    ) -> HelperReply[R] | HelperReply[None]:
        """The helper's reply on the node: read as `helper` when it is a reply type."""
        if isinstance(helper, str):
            return await self.raw_call(node_name, helper, args, timeout)
        return read_as(await self.raw_call(node_name, helper.helper, args, timeout), helper)

    async def raw_call(
        self, node_name: str, helper: str, args: Sequence[str], timeout: float | None
    ) -> HelperReply[None]:
        """The helper's document and exit status, or HelperCallError saying why none."""
        node = self.inventory.node(node_name)
        limit = self.timeout if timeout is None else timeout
        argv = helper_argv(node, helper, args, time_limit=limit)
        try:
            result = await self.transport.run(node, argv, timeout=limit)
        except TransportError as exc:
            raise HelperCallError(node_name, helper, str(exc), unreachable=True) from exc
        if result.timed_out:
            raise HelperTimedOut(node_name, helper, limit)
        return parse_reply(
            node_name, helper, argv, result.exit_status, result.stdout, result.stderr, self.caller
        )

    @overload
    async def on_nodes(
        self, nodes: Sequence[str], helper: type[R], *args: str, timeout: float | None = None
    ) -> dict[str, HelperReply[R] | HelperCallError]: ...

    @overload
    async def on_nodes(
        self, nodes: Sequence[str], helper: str, *args: str, timeout: float | None = None
    ) -> dict[str, HelperReply[None] | HelperCallError]: ...

    async def on_nodes(
        self, nodes: Sequence[str], helper: type[R] | str, *args: str, timeout: float | None = None
    ) -> (
        dict[str, HelperReply[R] | HelperCallError] | dict[str, HelperReply[None] | HelperCallError]
    ):
        """The same helper on every node at once; each node's reply or its error."""

        async def one(name: str) -> HelperReply[Any] | HelperCallError:
            try:
                return await self.call(name, helper, *args, timeout=timeout)
            except HelperCallError as exc:
                return exc

        replies = await asyncio.gather(*(one(name) for name in nodes))
        return dict(zip(nodes, replies, strict=True))
