"""Calling a node helper: the reply is the helper's own document and exit status; an
unreachable node, a timeout or output that is no helper document is an error that says
so, never read as the helper's answer. A node whose mlx-medic is deployed wrong for the
call is a HelperMisconfigured carrying what is wrong, where, and the one fix."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from mlx_medic.command_line import version
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.schema import Node
from mlx_medic.node.cli import helper_document
from mlx_medic.node.client import (
    REMEDIATOR,
    HelperCallError,
    HelperMisconfigured,
    HelperTimedOut,
    NodeHelpers,
    helper_argv,
    parse_reply,
    read_as,
)
from mlx_medic.node.misconfiguration import Misconfiguration, MisconfigurationKind
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
        "--time-limit",  # the helper ends itself when the call no longer waits for it
        "60",
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
    with pytest.raises(HelperTimedOut, match="no answer within 5s") as caught:
        asyncio.run(NodeHelpers(TimesOut(), inventory, 5).call("n1", "ledger"))  # type: ignore[arg-type]
    assert not caught.value.unreachable and caught.value.timed_out and caught.value.limit == 5


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        ("", "no helper document: boom"),
        ("not json\n", "no helper document"),
        ('{"up": true}\n', "no helper document"),
        (json.dumps(helper_document("clean", {})), "answered as 'clean'"),
    ],
)
def test_output_that_is_no_helper_document_is_an_error(stdout: str, why: str) -> None:
    with pytest.raises(HelperCallError, match=why):
        parse_reply("n1", "ledger", [], 1, stdout, "boom")


def test_a_failed_helper_still_returns_its_document_and_exit_status() -> None:
    document = json.dumps(helper_document("sweep", {"complete": False}))
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
    document = json.dumps(helper_document("sweep", {"unkillable": [{"pid": "x"}]}))
    raw = parse_reply("n1", "sweep", [], 1, document, "")
    with pytest.raises(HelperCallError) as caught:
        read_as(raw, SweepReply)
    assert str(caught.value) == (
        "n1: mlx-medic node sweep: exit 1, the document's unkillable[0].pid is 'x', not a pid"
    )
    assert not caught.value.no_answer  # it answered, but not well


# --- a node deployed wrong: what the call says about it, as data ----------------------------

N2 = Node(
    name="n2",
    ssh="127.0.0.3",
    medic_command="/opt/mlx-medic/bin/mlx-medic",
    medic_config=Path("/etc/mlx-medic/inventory.yaml"),
)
LOCK = helper_argv(N2, "lock", ["m1", "show"])
OURS = version()


def misconfigured(
    exit_status: int, stderr: str, stdout: str = "", argv: list[str] = LOCK
) -> Misconfiguration:
    with pytest.raises(HelperMisconfigured) as caught:
        parse_reply("n2", "lock", argv, exit_status, stdout, stderr, REMEDIATOR)
    assert caught.value.node == "n2" and not caught.value.no_answer  # it answered
    found = caught.value.misconfiguration
    assert str(caught.value) == f"n2: mlx-medic node lock: {found.detail}; fix: {found.fix}"
    return found


def test_a_helper_that_cannot_read_its_inventory_names_the_path_and_the_fix() -> None:
    found = misconfigured(
        2,
        "mlx-medic node lock: /etc/mlx-medic/inventory.yaml: cannot read:"
        " No such file or directory\n",
    )
    assert found == Misconfiguration(
        "n2",
        MisconfigurationKind.CONFIG_UNREADABLE,
        "mlx-medic on n2 cannot read its inventory /etc/mlx-medic/inventory.yaml:"
        " No such file or directory",
        "/etc/mlx-medic/inventory.yaml",
        "put the inventory at /etc/mlx-medic/inventory.yaml on n2, or set"
        " nodes.n2.medic_config to where it is",
    )


def test_a_forced_command_that_cannot_read_its_inventory_says_to_render_its_key_again() -> None:
    found = misconfigured(
        2, "mlx-medic node forced-command: /etc/inv.yaml: cannot read: Permission denied\n"
    )
    assert (found.kind, found.path) == ("config-unreadable", "/etc/inv.yaml")
    assert found.fix == (
        "put the inventory at /etc/inv.yaml on n2, or render and install authorized-keys"
        " for n2 again from nodes.n2.medic_config"
    )


@pytest.mark.parametrize(
    ("exit_status", "stderr"),
    [
        (127, "bash: line 1: /opt/mlx-medic/bin/mlx-medic: No such file or directory\n"),
        (127, "zsh:1: command not found: /opt/mlx-medic/bin/mlx-medic\n"),
        (126, "bash: line 1: /opt/mlx-medic/bin/mlx-medic: Permission denied\n"),
    ],
)
def test_a_missing_helper_names_medic_command_and_says_to_install_it(
    exit_status: int, stderr: str
) -> None:
    found = misconfigured(exit_status, stderr)
    assert (found.kind, found.path) == ("helper-missing", "/opt/mlx-medic/bin/mlx-medic")
    assert found.detail.startswith("mlx-medic on n2 is not")
    assert stderr.strip() in found.detail
    assert found.fix == (
        "install mlx-medic on n2 at /opt/mlx-medic/bin/mlx-medic (nodes.n2.medic_command)"
    )


def test_a_forced_command_that_refuses_the_call_says_to_render_the_keys_again() -> None:
    refusal = (
        "mlx-medic forced command: refused 'mlx-medic node probe m1 --timeout 30 --inventory"
        " /etc/mlx-medic/inventory.yaml --node n2 --json': the remediator key never sends"
        " 'node probe' (it sends: node facts, node lock)"
    )
    found = misconfigured(2, refusal + "\n")
    assert (found.kind, found.path) == ("refused", None)
    assert found.detail == f"n2's forced command refused the call: {refusal}"
    assert found.fix == (
        "render and install authorized-keys for n2 again (mlx-medic render authorized-keys):"
        " its forced command does not allow this call"
    )


@pytest.mark.parametrize(
    ("document", "detail", "fix"),
    [
        (
            {"version": "0.0.1"},
            f"n2 runs mlx-medic 0.0.1, this remediator {OURS}",
            f"upgrade mlx-medic on n2 to {OURS} (nodes first, then the remediator)",
        ),
        (
            {"version": None},  # a helper from before documents carried their version
            f"n2 runs an mlx-medic older than {OURS}, this remediator {OURS}",
            f"upgrade mlx-medic on n2 to {OURS} (nodes first, then the remediator)",
        ),
        (
            {"version": "99.0"},
            f"n2 runs mlx-medic 99.0, this remediator {OURS}",
            "upgrade this remediator to mlx-medic 99.0 (nodes first, then the remediator:"
            " n2 is done)",
        ),
        (
            {"schema": 2, "version": None},
            f"n2 runs another mlx-medic (helper documents of schema 2, not 1), this"
            f" remediator {OURS}",
            "upgrade this remediator to the mlx-medic n2 runs (nodes first, then the"
            " remediator: n2 is done)",
        ),
    ],
)
def test_a_document_of_another_version_or_schema_names_both_versions_and_the_upgrade(
    document: dict[str, object], detail: str, fix: str
) -> None:
    fields = {k: v for k, v in helper_document("lock", document).items() if v is not None}
    found = misconfigured(0, "", json.dumps(fields))
    assert (found.kind, found.detail, found.fix) == ("version-mismatch", detail, fix)


@pytest.mark.parametrize(
    "stderr",
    [
        # a helper from before `--inventory`, which it called `--config.file`
        "usage: mlx-medic node lock [-h] [--config.file FILE] [--json] model action\n"
        "mlx-medic node lock: error: unrecognized arguments: --inventory"
        " /etc/mlx-medic/inventory.yaml\n",
        # one from before the helper the call names
        "mlx-medic node: error: argument HELPER: invalid choice: 'lock' (choose from"
        " 'ledger', 'sweep') (see mlx-medic node --help)\n",
    ],
)
def test_an_older_helper_that_does_not_know_the_call_is_a_version_mismatch(stderr: str) -> None:
    found = misconfigured(2, stderr)
    assert found.kind == "version-mismatch"
    assert found.detail.startswith(
        f"n2 runs an mlx-medic older than {OURS}, this remediator {OURS}: it does not know"
        " this call ("
    )
    assert found.fix == f"upgrade mlx-medic on n2 to {OURS} (nodes first, then the remediator)"


@pytest.mark.parametrize(
    ("exit_status", "stderr"),
    [
        (1, "mlx-medic node lock: cannot write /var/lib/mlx-medic/locks/m1.lock: disk full\n"),
        (2, "mlx-medic node probe: error: argument --timeout: invalid float value: 'x'\n"),
        (2, "mlx-medic node sweep: no model 'm9' in /etc/mlx-medic/inventory.yaml\n"),
        (0, "Traceback (most recent call last):\n"),
    ],
)
def test_any_other_failure_stays_a_plain_helper_call_error(exit_status: int, stderr: str) -> None:
    with pytest.raises(HelperCallError) as caught:
        parse_reply("n2", "lock", LOCK, exit_status, "", stderr, REMEDIATOR)
    assert not isinstance(caught.value, HelperMisconfigured)
    assert f"exit {exit_status}, no helper document" in str(caught.value)


def test_every_helper_document_carries_the_version_that_wrote_it() -> None:
    assert helper_document("ledger", {"node": "n1"}) == {
        "schema": 1,
        "version": OURS,
        "command": "ledger",
        "node": "n1",
    }


def test_a_real_helper_whose_medic_config_is_missing_is_misconfigured(tmp_path: Path) -> None:
    """The issue's case: a node that does not name `medic_config`, without the default
    /etc/mlx-medic/inventory.yaml there (here: a path that is not there either)."""
    absent = tmp_path / "etc" / "inventory.yaml"
    found = real_call(tmp_path, f", medic_command: {MEDIC}, medic_config: {absent}")
    assert (found.node, found.kind, found.path) == ("n1", "config-unreadable", str(absent))
    assert found.detail.endswith(f"{absent}: No such file or directory")


def test_a_real_call_to_a_medic_command_that_is_not_there_is_misconfigured(
    tmp_path: Path,
) -> None:
    absent = tmp_path / "bin" / "mlx-medic"
    found = real_call(tmp_path, f", medic_command: {absent}")
    assert (found.node, found.kind, found.path) == ("n1", "helper-missing", str(absent))


def real_call(tmp_path: Path, n1: str) -> Misconfiguration:
    """What `node lock m1 show` on n1 (its inventory entry given `n1`) says is wrong."""
    path = tmp_path / "inventory.yaml"
    path.write_text(two_models(str(tmp_path / "state"), n1=n1))
    helpers = NodeHelpers(LocalTransport(), load_inventory(path), timeout=60, caller=REMEDIATOR)
    with pytest.raises(HelperMisconfigured) as caught:
        asyncio.run(helpers.call("n1", "lock", "m1", "show"))
    return caught.value.misconfiguration
