"""The key table against the code that sends over SSH, driven for real with recording
transports: the remediator's engine (recover down to its ring fallback, a manual run,
sweep-orphans, finish-stop's re-check), its model lock (take, a stale holder judged on
its node, break, renew, release, a crashed run's lock at start-up) and its remote probe;
the serve wrapper's model lock, start (start sweep, run record, clean), lease renewal,
relaunch after a crash and teardown, to its peers; and `mlx-medic doctor --config.file`,
which sends the read-only form of the arm's calls. Every command they send passes its
key's forced command, and every grant of the table (each optional option too) is sent by
one of them: the table is exactly what the arm (and its doctor) does, no more."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.model_lock import LockHandle, ModelLocks, lock_path
from mlx_medic.node.cli import helper_document
from mlx_medic.node.client import NodeHelpers
from mlx_medic.node.forced_command import Allowed, checked, helper_parser
from mlx_medic.node.key_table import KEYS, TABLE, Grant, KeyName, table_text
from mlx_medic.node.replies import RebootReply
from mlx_medic.remediator.cluster_doctor import check_cluster
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.model_health import HealthVerdict, ModelState, probe_model_health
from mlx_medic.remediator.playbooks.finish_stop import read_stop_record
from mlx_medic.serve.nodes import LeaseKeeper, ModelNodes, StartRefused
from mlx_medic.serve.preseed import check_room
from mlx_medic.serve.start import prepare_nodes, take_lock
from mlx_medic.serve.teardown import end_run, teardown_deadline
from mlx_medic.state.runs import new_run_id
from mlx_medic.transport import CommandResult, LocalTransport, RoutedTransport
from mlx_medic.transport.helper_session import session_argv
from testbed import free_port
from tests.remediator.engine_fakes import (
    MEDIC,
    MODEL,
    Health,
    alert,
    dead_pid,
    make_config,
    make_engine,
    make_inventory,
)
from tests.remediator.fake_helpers import DEFAULTS

Sent = list[tuple[str, list[str]]]  # (node, argv) of every command, in order
DOWN, UP = HealthVerdict.down("connection refused"), HealthVerdict.up("completed a request")
JACCL_LINE = "[jaccl] Couldn't allocate protection domain"
JACCL_FACTS = {
    **DEFAULTS["facts"],
    "log_errors": [{"signature": "jaccl_protection_domain", "line": JACCL_LINE}],
}
ORPHANS = {"orphans": [{"pid": 4242, "start_time": 1.0, "rule": "stale_run"}], "suspects": []}
DEAD = {"liveness": "dead", "why": "no such process"}


class Scripted:
    """A node transport that records (node, argv) of each command and answers it from a
    script: `answers[(node, helper)]`, else the helper's fake_helpers.DEFAULTS (the probe
    is up); `real` helpers run on this machine (LocalTransport: the lock keeps its state)."""

    def __init__(
        self, answers: dict[tuple[str, str], dict[str, Any]] | None = None, real: Iterable[str] = ()
    ) -> None:
        self.sent: Sent = []
        self.answers = dict(answers or {})
        self.real = set(real)
        self.local = LocalTransport()

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        self.sent.append((node.name, list(argv)))
        helper = argv[2]
        if helper in self.real:
            return await self.local.run(node, argv, timeout=timeout)
        document = self.answers.get((node.name, helper), DEFAULTS.get(helper, {}))
        return CommandResult(0, json.dumps(helper_document(helper, document)) + "\n", "")

    async def close(self) -> None:
        await self.local.close()


def stale_lock(inventory: Inventory, model: str, node: str, pid_start: float | None) -> None:
    """A lock a remediator on `node` left when it died (its pid is asked about there)."""
    path = lock_path(inventory.state_dir, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "node": node,
                "pid": dead_pid(),
                "pid_start": pid_start,
                "host": "gone",
                "time": 0.0,
                "holder": "remediator",
                "run_id": "1",
                "expires": 2e9,
                "token": "feedfacefeedface",
            }
        )
    )


async def walk(engine: Engine, *events: Any) -> None:
    try:
        for event in events:
            await engine.submit(event)
        await engine.wait_idle()
    finally:
        await engine.close()


async def remediator_sends(tmp_path: Path) -> tuple[Inventory, Sent]:
    """Everything the remediator sends to nodes on its paths (see the module)."""
    inventory = make_inventory(backoff=0, start_timeout="1s")  # one probe per verify
    transport = Scripted(
        {("ai001", "facts"): JACCL_FACTS, ("ai002", "orphans"): ORPHANS}, real={"lock", "pid-alive"}
    )

    def engine(name: str, health: Health, playbook: str = "recover") -> Engine:
        return make_engine(
            make_config(tmp_path / name, playbook), inventory, transport=transport, health=health
        )

    recover = engine("recover", Health(verdicts=[DOWN, DOWN, UP]))  # verify fails: pin ring
    await walk(recover, alert("r1"))
    (run,) = recover.journal.list_runs()
    assert [s.name for s in run.steps][-3:] == ["pin-ring", "restart-service", "verify-ring"]
    manual = engine("manual", Health(up=True))
    try:
        await manual.run_manual(MODEL, dry_run=False)
    finally:
        await manual.close()
    orphans = engine("orphans", Health(up=True), "sweep-orphans")
    await walk(orphans, alert("o1", labels={"node": "ai002"}))
    (swept,) = orphans.journal.list_runs()
    assert swept.steps[0].name == "sweep-orphans"

    locks = ModelLocks(inventory, transport, this_node=None, hostname="replica-a")
    for pid_start in (1.5, None):  # a holder's pid asked about with and without its start
        stale_lock(inventory, MODEL, "ai002", pid_start)
        handle = await locks.acquire(MODEL, "remediator", "7", renew=False)
        assert isinstance(handle, LockHandle), handle
        assert await locks.renew(handle)
        await locks.release(handle)
    crashed = await locks.acquire(MODEL, "remediator", "8", renew=False)  # then it crashed
    assert isinstance(crashed, LockHandle)
    assert await locks.release_of_ended_run(MODEL, "8", "replica-a", crashed.info.pid)

    probed = await probe_model_health(
        inventory.model(MODEL), inventory, transport=transport, probe_from="head"
    )
    assert probed.state is ModelState.UP, probed  # the helper's answer, read as the probe's
    await read_stop_record(NodeHelpers(transport, inventory, 30), inventory.model(MODEL))
    # reboot-node's reboot step (its runs: tests/remediator/test_reboot_node.py)
    await NodeHelpers(transport, inventory, 30).call("ai002", RebootReply)
    # `mlx-medic drain` and `undrain`: the record on the node (tests/node/test_node_drain.py)
    helpers = NodeHelpers(transport, inventory, 30)
    await helpers.call("ai002", "drain", "set", "--by", "alice@host", "--models", MODEL)
    await helpers.call("ai002", "drain", "set", "--by", "alice@host")
    await helpers.call("ai002", "drain", "clear")
    return inventory, transport.sent


async def doctor_sends() -> tuple[Inventory, Sent]:
    """Everything `mlx-medic doctor --config.file` sends to the nodes of an inventory."""
    inventory = make_inventory()
    transport = Scripted()
    results = await check_cluster(inventory, transport)
    assert [r for r in results if r.status == "failed"] == []
    return inventory, transport.sent


class LiveLaunch:
    """mlx.launch still running at the teardown: the ranks get the full grace."""

    running = True

    async def end(self, grace: float) -> None:
        return None


async def serve_sends(tmp_path: Path) -> tuple[Inventory, Sent]:
    """Everything the serve wrapper on the head sends to its peers (over SSH, with its own
    key); what it asks of its head runs there without SSH and is no key's."""
    path = tmp_path / "serve-inventory.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(tmp_path / "state"),
                "nodes": {
                    f"ai00{i}": {
                        "ssh": f"127.0.0.{i + 1}",
                        "medic_command": MEDIC,
                        "medic_config": str(path),
                    }
                    for i in (1, 2, 3)
                },
                "models": {
                    "tiny": {
                        "model": "/models/tiny",
                        "nodes": ["ai001", "ai002", "ai003"],
                        "port": free_port(),
                        "service": {"manager": "supervisord", "label": "tiny"},
                        "backends": {"ring": {"hostfile": "/etc/ring.json"}},
                    }
                },
            }
        )
    )
    inventory = load_inventory(path)
    model = inventory.model("tiny")
    peers = Scripted({("ai002", "pid-alive"): DEAD})
    transport = RoutedTransport(model.head, Scripted(), peers)  # as mlx_medic.serve.cli.serve
    nodes = ModelNodes(NodeHelpers(transport, inventory, 30.0), model, 30.0)
    locks = ModelLocks(inventory, transport, this_node=model.head, in_process=True)
    holder = f"serve pid {os.getpid()} on {model.head}"  # as mlx_medic.serve.cli.serve writes it
    lease = model.serve.lease
    try:
        for pid_start in (1.5, None):  # a remediator on ai002 left the lock, and died
            stale_lock(inventory, model.name, "ai002", pid_start)
            await locks.release(await take_lock(locks, model, new_run_id()))
        run_id = new_run_id()
        await (await prepare_nodes(nodes, run_id, lease, holder, lambda: None)).cleaning
        await check_room(nodes)
        preseed = model.serve.preseed.model_copy(update={"enabled": True, "compare": "sha256"})
        digests = model.model_copy(
            update={"serve": model.serve.model_copy(update={"preseed": preseed})}
        )
        with contextlib.suppress(StartRefused):  # the fake head holds no weights to stage
            await check_room(ModelNodes(nodes.helpers, digests, 30.0))  # compare: sha256
        keeper = LeaseKeeper(nodes, run_id, lease, holder)
        keeper.start()
        while not any("renew" in argv for _, argv in peers.sent):
            await asyncio.sleep(0.01)
        await keeper.stop()
        await end_run(nodes, run_id, None, teardown_deadline(model))  # mlx.launch crashed
        relaunch = new_run_id()
        prepared = await prepare_nodes(
            nodes, relaunch, lease, holder, lambda: None, crashed_run=run_id
        )
        await prepared.cleaning
        await end_run(nodes, relaunch, LiveLaunch(), teardown_deadline(model))  # type: ignore[arg-type]
    finally:
        await transport.close()
    return inventory, peers.sent


def grants_sent(key: KeyName, inventory: Inventory, sent: Sent) -> set[tuple[str, str]]:
    """(grant shape, option) of every command sent, each checked by the forced command as
    it runs on that node with that key ("" for the grant itself)."""
    seen: set[tuple[str, str]] = set()
    for node_name, argv in sent:
        node = inventory.node(node_name)
        allowed = Allowed(inventory, node.medic_config, node_name, key=key)
        _, grant = checked(shlex.join(argv), allowed)
        seen.add((grant.shape(), ""))
        seen |= {
            (grant.shape(), option)
            for option in grant.optional
            if any(word.partition("=")[0] == option for word in argv)
        }
    return seen


def over_ssh(inventory: Inventory, sent: Sent) -> Sent:
    """What the SSH transport sends for these calls: a helper session on each node it
    reaches first (mlx_medic.transport.helper_session), then each call through it."""
    nodes = sorted({node for node, _ in sent})
    return [(node, session_argv(inventory.node(node))) for node in nodes] + sent


def every_entry(key: KeyName) -> set[tuple[str, str]]:
    return {(g.shape(), option) for g in TABLE[key] for option in ("", *g.optional)}


async def test_everything_the_remediator_sends_passes_its_key_and_uses_every_grant(
    tmp_path: Path,
) -> None:
    inventory, sent = await remediator_sends(tmp_path)
    assert sent and all(argv[0] == inventory.node(node).medic_command for node, argv in sent)
    doctor_inventory, doctor_sent = await doctor_sends()
    assert grants_sent("remediator", inventory, over_ssh(inventory, sent)) | grants_sent(
        "remediator", doctor_inventory, over_ssh(doctor_inventory, doctor_sent)
    ) == every_entry("remediator")


async def test_everything_the_serve_wrapper_sends_its_peers_passes_its_key_and_uses_every_grant(
    tmp_path: Path,
) -> None:
    inventory, sent = await serve_sends(tmp_path)
    assert {node for node, _ in sent} == {"ai002", "ai003"}  # never its own head over SSH
    assert grants_sent("serve", inventory, over_ssh(inventory, sent)) == every_entry("serve")


def positionals(parser: argparse.ArgumentParser, action: str | None) -> set[str]:
    """The positional dests of a helper's parser (and of its action's subparser)."""
    found = set()
    for item in parser._actions:
        if isinstance(item, argparse._SubParsersAction):
            found |= {"action"} | positionals(item.choices[action], None) if action else set()
        elif not item.option_strings:
            found.add(item.dest)
    return found


@pytest.mark.parametrize(
    ("key", "grant"),
    [(k, g) for k in KEYS for g in TABLE[k]],
    ids=lambda item: item if isinstance(item, str) else item.shape(),
)
def test_every_grant_names_each_positional_and_only_options_its_helper_has(
    key: KeyName, grant: Grant
) -> None:
    parser = helper_parser(grant.helper)
    named = set(grant.args) | ({"model"} if grant.model else set())
    assert positionals(parser, grant.action) == named | ({"action"} if grant.action else set())
    text = " ".join(
        a.format_usage()
        for a in [
            parser,
            *(
                s
                for i in parser._actions
                if isinstance(i, argparse._SubParsersAction)
                for s in i.choices.values()
            ),
        ]
    )
    assert all(option in text for option in (*grant.options, *grant.optional))


def test_the_table_prints_as_the_docs_show_it() -> None:
    text = table_text()
    assert "### `--key remediator`" in text and "### `--key serve`" in text
    assert (
        "| `mlx-medic node sweep MODEL --start-sweep --grace GRACE [--crashed-run RUN_ID]`"
        " | the wrapper's start sweep"
    ) in text
