"""Before any rank of a start: every node's room judged, then the weights staged to the
nodes that lack them.

The room (`check_room`, after the start sweep, whose ended orphans free their memory, and
before the smoke test, so a start that cannot fit spends no protection domain): each
node's usable memory (mlx_medic.node.room) against what a rank needs
(`serve.memory_needed`, else the weights' bytes over the node count plus 20%), and, with
`serve.preseed`, each receiving node's free bytes where share stages against the bytes it
will receive. Every shortfall is named with its node; nothing is transferred or started.

The staging (`stage_weights`, after the clean, which must not race share's own `tmp*`
dir): the real `mlx_lm share --path WEIGHTS --tmpdir DIR`, or the inventory's
`serve.preseed.command` with its placeholders filled in, over the head (rank 0, the
sender) and the nodes whose copy lacks the head's (file names and sizes; with `compare:
sha256` their digests too), launched as the smoke test and the model are (mlx.launch with
the ring hostfile's rows of those nodes, the rank guard, the run id in every rank's
environment), so the next start sweep ends a staging that a crash left and the clean
removes its partial `tmp*` dir. Its output goes to the log at most every
PROGRESS_EVERY seconds (share's own progress bars: bytes and rate of the file under
way), and its end as the bytes, nodes, time and mean rate.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlx_medic.inventory.model import Backend, Model
from mlx_medic.inventory.model_settings import PRESEED_PLACEHOLDERS
from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.client import HelperCallError, HelperReply
from mlx_medic.node.replies import RoomReply
from mlx_medic.node.room import memory_needed
from mlx_medic.serve.launch import launch_argv
from mlx_medic.serve.nodes import ModelNodes, StartRefused
from mlx_medic.serve.supervise import Launch

log = logging.getLogger("mlx_medic.serve")

SHARE_LINES_KEPT = 50
PROGRESS_EVERY = 5.0  # seconds between two progress lines in the log
CURSOR = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # tqdm's moves between its two bars


@dataclass
class RoomVerdict:
    """What the rooms say: the memory a rank needs (None: unknown, not checked), the
    nodes to stage the weights to and the bytes each receives, and every shortfall."""

    needed: int | None
    receivers: list[str] = field(default_factory=list)
    weights_bytes: int = 0
    shortfalls: list[str] = field(default_factory=list)


def judge_rooms(model: Model, rooms: dict[str, RoomReply]) -> RoomVerdict:
    """Shortfalls in node order: memory on every node, then (with preseed) the head's
    weights and each receiver's staging space."""
    head = rooms[model.head]
    held = (
        head.weights
        if head.weights is not None
        else next((r.weights for r in rooms.values() if r.weights is not None), None)
    )
    weights_bytes = sum(held.values()) if held else 0
    verdict = RoomVerdict(memory_needed(model, weights_bytes), weights_bytes=weights_bytes)
    for node, room in rooms.items():
        usable = room.usable_memory
        if verdict.needed is not None and usable is not None and usable < verdict.needed:
            capped = " (the GPU's wired limit)" if usable != room.available_bytes else ""
            verdict.shortfalls.append(
                f"{node}: {usable} bytes of memory available{capped}, the model needs"
                f" {verdict.needed} ({verdict.needed - usable} short)"
            )
    if not model.serve.preseed.enabled:
        return verdict
    weights = model.weights_path()
    if head.weights is None:
        verdict.shortfalls.append(
            f"{model.head}: the head holds no weights at {weights}: nothing to stage from"
        )
        return verdict
    by_digest = model.serve.preseed.compare == "sha256"
    for node in model.nodes[1:]:
        room = rooms[node]
        differ = differing(head, room, by_digest)
        if differ is None:
            continue
        if room.weights is not None:
            verdict.shortfalls.append(
                f"{node}: holds weights at {weights} that differ from the head's ({differ}):"
                " remove them, and the next start stages the head's"
            )
            continue
        verdict.receivers.append(node)
        if not room.staging_exists:
            verdict.shortfalls.append(
                f"{node}: {room.staging_dir} does not exist: make it (share stages the"
                " weights in it, beside where they go)"
            )
            continue
        free = room.free_bytes
        if free is not None and free < weights_bytes:
            verdict.shortfalls.append(
                f"{node}: {room.staging_dir} has {free} bytes free, the weights need"
                f" {weights_bytes} ({weights_bytes - free} short)"
            )
    return verdict


def differing(head: RoomReply, room: RoomReply, by_digest: bool) -> str | None:
    """How the node's weights differ from the head's, in words; None when they are the
    head's (names and sizes, and with `by_digest` each file's SHA-256)."""
    if room.weights != head.weights:
        return "names or sizes"
    if not by_digest:
        return None
    if head.digests is None or room.digests is None:
        return "no SHA-256 read"
    files = sorted(
        n
        for n in head.digests.keys() | room.digests.keys()
        if head.digests.get(n) != room.digests.get(n)
    )
    if not files:
        return None
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return f"SHA-256 of {shown}"


def room_args(nodes: ModelNodes) -> tuple[list[str], float]:
    """The room helper's arguments and time limit: with `compare: sha256`, every weights
    file is read, so the call gets the model's start_timeout."""
    model = nodes.model
    if model.serve.preseed.enabled and model.serve.preseed.compare == "sha256":
        return [model.name, "--sha256"], max(nodes.timeout, model.policy.start_timeout)
    return [model.name], nodes.timeout


async def check_room(nodes: ModelNodes) -> RoomVerdict:
    """Every node's room, judged; StartRefused naming each shortfall (or each node that
    did not answer), before anything is transferred or started."""
    model = nodes.model
    args, limit = room_args(nodes)
    replies: dict[str, HelperReply[RoomReply] | HelperCallError] = await nodes.on_all(
        RoomReply, *args, timeout=limit
    )
    rooms: dict[str, RoomReply] = {}
    unanswered = []
    for node, reply in replies.items():
        if isinstance(reply, HelperCallError) or not reply.ok:
            unanswered.append(
                str(reply) if isinstance(reply, HelperCallError) else f"{node}: {reply.stderr}"
            )
        else:
            rooms[node] = reply.answer
            if reply.answer.memory_seam:
                log.warning(
                    "room on %s: memory read from the testbed's seam %s: never on a real cluster",
                    node,
                    reply.answer.memory_seam,
                )
    if unanswered:
        raise StartRefused(
            "the room check before the start could not read every node: " + "; ".join(unanswered)
        )
    verdict = judge_rooms(model, rooms)
    if verdict.shortfalls:
        raise StartRefused(
            "too little room, so nothing is transferred or started: "
            + "; ".join(verdict.shortfalls)
        )
    if verdict.needed is not None:
        log.info(
            "room: every node has the %d bytes of memory a rank needs (%s)",
            verdict.needed,
            ", ".join(f"{n}: {rooms[n].usable_memory}" for n in model.nodes),
        )
    return verdict


def share_hostfile(model: Model, nodes: list[str], path: Path) -> Path:
    """The ring hostfile's rows (in rank order, one per node of the model) of `nodes`."""
    assert model.backends.ring is not None
    data = json.loads(model.backends.ring.hostfile.read_text(encoding="utf-8"))
    rows = data["hosts"] if isinstance(data, dict) else data
    if len(rows) != len(model.nodes):
        raise StartRefused(
            f"the ring hostfile {model.backends.ring.hostfile} has {len(rows)} rows for"
            f" {len(model.nodes)} nodes: the preseed cannot tell which row is whose"
        )
    chosen = [rows[model.nodes.index(node)] for node in nodes]
    share = {**data, "hosts": chosen} if isinstance(data, dict) else chosen
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(share), encoding="utf-8")
    return path


def share_command(weights: Path) -> list[str]:
    return ["-m", "mlx_lm", "share", "--path", str(weights), "--tmpdir", str(weights.parent)]


def stage_command(inventory: Inventory, model: Model) -> tuple[list[str], bool, str]:
    """What each rank of the staging runs: (its words, whether they are the ranks'
    interpreter's arguments, its name for the log): `serve.preseed.command` with each
    word that is a placeholder replaced, else mlx_lm share."""
    weights = model.weights_path()
    assert weights is not None
    command = model.serve.preseed.command
    if command is None:
        return share_command(weights), True, "mlx_lm.share"
    values = {
        "{path}": str(weights),
        "{tmpdir}": str(weights.parent),
        "{head}": inventory.node(model.head).ssh,
    }
    assert values.keys() == PRESEED_PLACEHOLDERS.keys()
    return [values.get(word, word) for word in command], False, Path(command[0]).name


async def stage_weights(
    inventory: Inventory,
    nodes: ModelNodes,
    run_id: str,
    env: dict[str, str],
    verdict: RoomVerdict,
    stop: asyncio.Event,
    on_launch: Callable[[Launch | None], None],
) -> None:
    """The staging (mlx_lm.share or `serve.preseed.command`) from the head to
    `verdict.receivers` (none: the log says every node holds the head's weights);
    StartRefused when it fails or a receiver's copy then differs. `on_launch` is told of
    the staging while it runs (the teardown ends it when `stop` is set meanwhile: this
    then returns at once) and of its end (None)."""
    model = nodes.model
    weights = model.weights_path()
    assert weights is not None
    how = "file names and sizes" + (
        " and SHA-256" if model.serve.preseed.compare == "sha256" else ""
    )
    if not verdict.receivers:
        log.info(
            "preseed skipped: every node holds the head's weights at %s (%d bytes; same %s)",
            weights,
            verdict.weights_bytes,
            how,
        )
        return
    hostfile = share_hostfile(
        model,
        [model.head, *verdict.receivers],
        inventory.state_dir / "runs" / f"{model.name}.share-{run_id}.json",
    )
    command, python_args, name = stage_command(inventory, model)
    argv = launch_argv(
        inventory,
        model,
        "ring",
        Backend(hostfile=hostfile),
        run_id,
        command,
        python_args=python_args,
    )
    log.info(
        "preseed: staging %s (%d bytes) from %s to %s with %s: %s",
        weights,
        verdict.weights_bytes,
        model.head,
        ", ".join(verdict.receivers),
        name,
        " ".join(argv),
    )
    progress = Progress(name)
    share = Launch(argv, env, on_line=progress.line, keep=SHARE_LINES_KEPT)
    on_launch(share)
    began = time.monotonic()
    await share.start()
    waiting = asyncio.ensure_future(share.wait(model.policy.start_timeout))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not waiting.done():
        waiting.cancel()
        log.info(
            "preseed: stopped after %.1fs; the teardown ends %s", time.monotonic() - began, name
        )
        return
    code = waiting.result()
    elapsed = time.monotonic() - began
    if code is None:
        await share.end(model.policy.kill_grace)
        raise StartRefused(
            f"preseed: {name} did not end within policy.start_timeout"
            f" ({model.policy.start_timeout:g}s)"
        )
    hostfile.unlink(missing_ok=True)
    on_launch(None)
    progress.flush()
    tail = next((line for line in reversed(share.lines) if line.strip()), "")
    if code != 0 or share.rank_ended:
        raise StartRefused(f"preseed: {name} failed (exit {code}): {share.rank_ended or tail}")
    args, limit = room_args(nodes)
    after = await nodes.helpers.on_nodes(
        [model.head, *verdict.receivers], RoomReply, *args, timeout=limit
    )
    rooms = {n: r.answer for n, r in after.items() if isinstance(r, HelperReply) and r.ok}
    head = rooms.get(model.head)
    differ = [
        f"{node} ({why})"
        for node in verdict.receivers
        if (
            why := "unread"
            if head is None or node not in rooms
            else differing(head, rooms[node], model.serve.preseed.compare == "sha256")
        )
    ]
    if differ:
        raise StartRefused(
            f"preseed: after {name}, the weights at {weights} on {', '.join(differ)} still"
            " differ from the head's"
        )
    log.info(
        "preseed: staged %d bytes to %s in %.1fs (%.1f MB/s, the launch included); each now"
        " holds the head's weights (same %s)",
        verdict.weights_bytes,
        ", ".join(verdict.receivers),
        elapsed,
        verdict.weights_bytes / max(elapsed, 1e-6) / 1e6,
        how,
    )


class Progress:
    """The staging's output in the log: its latest line at most every PROGRESS_EVERY
    seconds (share's progress bars redraw with CR and cursor moves: each line's last
    state), and the last one not yet logged at its end."""

    def __init__(
        self, name: str, every: float = PROGRESS_EVERY, clock: Callable[[], float] = time.monotonic
    ):
        self.name = name
        self.every = every
        self.clock = clock
        self.logged_at: float | None = None
        self.pending = ""

    def line(self, line: str) -> None:
        shown = CURSOR.sub("", line.rsplit("\r", 1)[-1]).strip()
        if not shown:
            return
        now = self.clock()
        if self.logged_at is not None and now - self.logged_at < self.every:
            self.pending = shown
            return
        self.logged_at, self.pending = now, ""
        log.info("preseed: %s: %s", self.name, shown)

    def flush(self) -> None:
        if self.pending:
            log.info("preseed: %s: %s", self.name, self.pending)
            self.pending = ""
