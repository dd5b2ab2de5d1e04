"""Which inventory node a process runs on: `--node`, else `<state_dir>/node-id`; never
guessed from host names or addresses (testbed nodes share both with the machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.inventory.schema import Inventory
from mlx_medic.state.node_identity import (
    NodeIdentityError,
    read_node_id,
    resolve_node,
    write_node_id,
)


@pytest.fixture
def inventory() -> Inventory:
    return parse_inventory("""
nodes: {ai001: {ssh: 127.0.0.2}, ai002: {ssh: 127.0.0.3}}
models: {}
""")


def test_the_name_asked_for_wins_over_the_file(tmp_path: Path, inventory: Inventory) -> None:
    write_node_id(tmp_path, "ai002")
    assert resolve_node(inventory, "ai001", tmp_path) == "ai001"
    assert resolve_node(inventory, None, tmp_path) == "ai002"


def test_with_an_inventory_and_no_name_the_error_says_both_ways(
    tmp_path: Path, inventory: Inventory
) -> None:
    with pytest.raises(
        NodeIdentityError,
        match=r"pass --node NAME or write it to .*node-id"
        r" \(nodes: ai001, ai002\)",
    ):
        resolve_node(inventory, None, tmp_path)


def test_a_name_the_inventory_lacks_is_refused_saying_where_it_came_from(
    tmp_path: Path, inventory: Inventory
) -> None:
    with pytest.raises(NodeIdentityError, match=r"--node 'ai009' is not in the inventory"):
        resolve_node(inventory, "ai009", tmp_path)
    write_node_id(tmp_path, "ai009")
    with pytest.raises(NodeIdentityError, match=r"node-id names 'ai009', which is not in"):
        resolve_node(inventory, None, tmp_path)


def test_without_an_inventory_no_name_is_discovery_mode(tmp_path: Path) -> None:
    assert resolve_node(None, None, tmp_path) is None
    write_node_id(tmp_path, "ai001")
    assert resolve_node(None, None, tmp_path) == "ai001"


def test_a_node_id_file_holds_exactly_one_name(tmp_path: Path) -> None:
    (tmp_path / "node-id").write_text("ai001\nai002\n")
    with pytest.raises(NodeIdentityError, match="must hold one node name"):
        read_node_id(tmp_path)
    (tmp_path / "node-id").write_text("  \n")
    with pytest.raises(NodeIdentityError, match="must hold one node name"):
        read_node_id(tmp_path)
