"""`mlx-medic node orphans [MODEL]`: with an inventory, MODEL is one placed on this node;
any other name is a bad command line (exit 2) naming it, never an empty report."""

from __future__ import annotations

from pathlib import Path

from tests.node.helper_runner import two_model_helpers


def test_a_model_placed_on_this_node_gets_its_report(tmp_path: Path) -> None:
    document = two_model_helpers(tmp_path).document("orphans", "m1", node="n1")
    assert document["node"] == "n1" and document["model"] == "m1"
    assert all(e["model"] == "m1" for e in document["orphans"] + document["suspects"])


def test_a_model_not_placed_on_this_node_is_refused_naming_it(tmp_path: Path) -> None:
    result = two_model_helpers(tmp_path).run("orphans", "m2", node="n1")
    assert result.returncode == 2 and result.stdout == ""
    assert "model 'm2' is not placed on node n1 (its nodes: n2)" in result.stderr


def test_a_model_not_in_the_inventory_is_refused_naming_it(tmp_path: Path) -> None:
    result = two_model_helpers(tmp_path).run("orphans", "m9", node="n1")
    assert result.returncode == 2 and "model 'm9' is not in the inventory" in result.stderr
