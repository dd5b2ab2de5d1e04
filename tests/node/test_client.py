"""Calling a node helper: the reply is the helper's own document and exit status; an
unreachable node, a timeout or output that is no helper document is an error that says
so, never read as the helper's answer."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.schema import Node
from mlx_medic.node.client import (
    HelperCallError,
    NodeHelpers,
    helper_argv,
    parse_reply,
    read_as,
)
from mlx_medic.node.replies import Fields, RunReply
from mlx_medic.node.sweep_reply import SweepReply
from mlx_medic.transport import CommandResult, LocalTransport, TransportError
from tests.node.inventories import two_models

MEDIC = str(Path(sys.executable).with_name("mlx-medic"))


def inventory_file(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    extra = f", medic_command: {MEDIC}, medic_config: {path}"
    path.write_text(two_models(str(tmp_path / "state"), n1=extra))
    return path


def test_a_helper_runs_with_the_nodes_inventory_and_name_and_its_document_comes_back(
    tmp_path: Path,
) -> None:
    inventory = load_inventory(inventory_file(tmp_path))
    helpers = NodeHelpers(LocalTransport(), inventory, timeout=60)
    reply = asyncio.run(helpers.call("n1", "ledger"))
    assert reply.ok and reply.document["node"] == "n1" and reply.document["debt"] == 0
    config = str(tmp_path / "inventory.yaml")
    assert reply.argv == [
        MEDIC,
        "node",
        "ledger",
        "--inventory",
        config,
        "--node",
        "n1",
        "--json",
    ]


def test_helper_argv_never_passes_through_a_shell() -> None:
    node = Node(name="n1", ssh="127.0.0.2")
    argv = helper_argv(node, "sweep", ["m1; id"])
    assert argv[:4] == ["mlx-medic", "node", "sweep", "m1; id"]  # one word, never split


class Unreachable:
    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        raise TransportError(f"cannot reach {node.name}")


class TimesOut:
    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        return CommandResult(None, "", "", timed_out=True)


def test_an_unreachable_node_is_an_error_marked_unreachable_per_node(tmp_path: Path) -> None:
    inventory = load_inventory(inventory_file(tmp_path))
    helpers = NodeHelpers(Unreachable(), inventory, 5)  # type: ignore[arg-type]
    replies = asyncio.run(helpers.on_nodes(["n1", "n2"], "ledger"))
    assert all(isinstance(r, HelperCallError) and r.unreachable for r in replies.values())
    assert "n2" in str(replies["n2"])


def test_a_timeout_is_an_error_not_an_answer(tmp_path: Path) -> None:
    inventory = load_inventory(inventory_file(tmp_path))
    with pytest.raises(HelperCallError, match="no answer within 5s") as caught:
        asyncio.run(NodeHelpers(TimesOut(), inventory, 5).call("n1", "ledger"))  # type: ignore[arg-type]
    assert not caught.value.unreachable


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        ("", "no helper document: boom"),
        ("not json\n", "no helper document"),
        ('{"schema": 9, "command": "ledger"}\n', "no helper document"),
        ('{"schema": 1, "command": "clean"}\n', "answered as 'clean'"),
    ],
)
def test_output_that_is_no_helper_document_is_an_error(stdout: str, why: str) -> None:
    with pytest.raises(HelperCallError, match=why):
        parse_reply("n1", "ledger", [], 1, stdout, "boom")


def test_a_failed_helper_still_returns_its_document_and_exit_status() -> None:
    document = '{"schema": 1, "command": "sweep", "complete": false}'
    reply = parse_reply("n1", "sweep", [], 1, document, "")
    assert not reply.ok and reply.exit_status == 1 and reply.document["complete"] is False


def test_a_reply_type_reads_the_document_once_where_it_arrives(tmp_path: Path) -> None:
    inventory = load_inventory(inventory_file(tmp_path))
    helpers = NodeHelpers(LocalTransport(), inventory, timeout=60)
    reply = asyncio.run(helpers.call("n1", RunReply, "m1", "show"))
    assert reply.ok and reply.document["command"] == "run"  # the raw document, as journaled
    assert reply.answer == RunReply.parse("n1", Fields(reply.document)) == RunReply()
    replies = asyncio.run(helpers.on_nodes(["n1"], RunReply, "m1", "show"))
    assert replies["n1"] == reply


def test_a_document_a_reply_type_cannot_read_is_an_error_naming_node_helper_and_field() -> None:
    document = '{"schema": 1, "command": "sweep", "unkillable": [{"pid": "x"}]}'
    raw = parse_reply("n1", "sweep", [], 1, document, "")
    with pytest.raises(HelperCallError) as caught:
        read_as(raw, SweepReply)
    assert str(caught.value) == (
        "n1: mlx-medic node sweep: exit 1, the document's unkillable[0].pid is 'x', not a pid"
    )
    assert not caught.value.no_answer  # it answered, but not well
