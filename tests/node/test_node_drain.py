"""The drain recorded on the node itself (`mlx-medic node drain set|clear`, which `mlx-medic
drain` and `undrain` send): written to the node's state dir, shown by `node facts`
(`drain`), removed at the undrain; the remediator's key may send exactly those two. The
whole drain and undrain on real nodes: tests/serve/test_drain_reboot.py."""

from __future__ import annotations

import json
import subprocess

import pytest

from mlx_medic.inventory.schema import Inventory
from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.node.forced_command import Allowed, Refused, checked
from mlx_medic.node.replies import Fields
from mlx_medic.state.node_drain import node_drain_path
from tests.remediator.engine_fakes import MEDIC, MODEL, make_inventory

NODE = "ai002"


def helper(inventory: Inventory, *args: str) -> dict[str, object]:
    config = str(inventory.node(NODE).medic_config)
    done = subprocess.run(
        [MEDIC, "node", *args, "--inventory", config, "--node", NODE, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_drain_set_is_in_the_nodes_facts_until_clear() -> None:
    inventory = make_inventory()
    said = helper(inventory, "drain", "set", "--by", "alice@host", "--models", MODEL)
    assert said["drain"] == {
        "by": "alice@host",
        "since": pytest.approx(said["drain"]["since"]),  # type: ignore[index]
        "models": [MODEL],
    }
    assert node_drain_path(inventory.state_dir).exists()
    facts = helper(inventory, "facts")
    assert facts["drain"]["by"] == "alice@host"  # type: ignore[index]
    assert FactsReply.parse(NODE, Fields.of(facts)).drained_by == "alice@host"
    assert helper(inventory, "drain", "clear")["drain"] is None
    assert helper(inventory, "facts")["drain"] is None
    assert not node_drain_path(inventory.state_dir).exists()


def test_the_remediators_key_sends_set_and_clear_and_no_path_or_show() -> None:
    inventory = make_inventory()
    config = inventory.node(NODE).medic_config
    allowed = Allowed(inventory, config, NODE, key="remediator")
    tail = f"--inventory {config} --node {NODE} --json --time-limit 30"
    for sent in (f"drain set --by alice@host --models {MODEL}", "drain clear"):
        assert checked(f"{MEDIC} node {sent} {tail}", allowed)[1].helper == "drain"
    for refused in (
        "drain show",
        "drain set --by alice@host --models ../x",
        "drain set --by alice@host --state-dir /tmp",
    ):
        with pytest.raises(Refused):
            checked(f"{MEDIC} node {refused} {tail}", allowed)
