"""The forced command's validator: only `mlx-medic node <helper>` and `mlx-medic probe`,
with options whose values the inventory allows; everything else refused, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_medic.inventory import parse_inventory
from mlx_medic.node.cli import HELPERS
from mlx_medic.node.forced_command import Allowed, Refused, validate
from tests.node.inventories import two_models

CONFIG = Path("/etc/mlx-medic/inventory.yaml")
INVENTORY = parse_inventory(
    two_models(n1=", medic_command: /opt/mlx-medic/bin/mlx-medic", m2="\n    host: 0.0.0.0")
)
ALLOWED = Allowed(INVENTORY, CONFIG)


def check(line: str) -> list[str]:
    return validate(line, ALLOWED)


def test_a_node_helper_runs_with_the_keys_own_inventory() -> None:
    assert check("mlx-medic node ledger --json") == [
        "node", "ledger", "--json", "--config.file", str(CONFIG),
    ]  # fmt: skip
    assert check("/opt/mlx-medic/bin/mlx-medic node ledger --node n1 --json")[:5] == [
        "node", "ledger", "--node", "n1", "--json",
    ]  # fmt: skip
    assert check(f"mlx-medic node ledger --config.file={CONFIG} --state-dir /var/lib/mlx-medic/")[
        -2:
    ] == ["--state-dir", "/var/lib/mlx-medic"]


def test_the_probe_runs_for_a_models_host_and_port_as_the_remediator_asks() -> None:
    line = ("mlx-medic probe --host 127.0.0.1 --port 8080 --timeout 10"
            " --lock-dir /var/lib/mlx-medic/locks")  # fmt: skip
    assert check(line) == ["probe", "--host", "127.0.0.1", "--port", "8080", "--timeout", "10",
                           "--lock-dir", "/var/lib/mlx-medic/locks"]  # fmt: skip
    assert check("mlx-medic probe --host 127.0.0.1 --port 8081")[0] == "probe"  # 0.0.0.0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("", "no command given"),
        ("sh -c 'mlx-medic node ledger'", "'sh' is not mlx-medic"),
        ("mlx-medic node ledger --json; rm -rf /", "'--json;' is not allowed"),
        ("mlx-medic node ledger --json ; id", "unexpected argument ';'"),
        ("mlx-medic node ledger && id", "unexpected argument '&&'"),
        ("mlx-medic node ledger $(id)", "unexpected argument '$(id)'"),
        ("mlx-medic node ledger 'unclosed", "cannot split"),
        ("/tmp/mlx-medic node ledger", "'/tmp/mlx-medic' is not mlx-medic"),
        ("mlx-medic node reboot", "'node reboot' is not allowed"),
        ("mlx-medic node forced-command", "'node forced-command' is not allowed"),
        ("mlx-medic node", "no node helper"),
        ("mlx-medic remediate m1", "'remediate' is not allowed"),
        ("mlx-medic", "no mlx-medic subcommand"),
        ("mlx-medic node ledger --config.file /tmp/evil.yaml", "not the inventory's"),
        ("mlx-medic node ledger --state-dir /etc", "not the inventory's"),
        ("mlx-medic node ledger --state-dir /var/lib/mlx-medic/../../etc", "not the inventory's"),
        ("mlx-medic node ledger --node n9", "node 'n9' is not in the inventory"),
        ("mlx-medic node ledger --node", "needs a value"),
        ("mlx-medic node ledger --json --json", "given twice"),
        ("mlx-medic node ledger --json=yes", "takes no value"),
        ("mlx-medic probe --host 127.0.0.1 --port 9999", "no model in the inventory listens"),
        ("mlx-medic probe --host 10.0.0.1 --port 8080", "no model in the inventory listens"),
        ("mlx-medic probe --port 8080", "probe needs --host"),
        ("mlx-medic probe --host 127.0.0.1 --port 8080 --lock-dir /tmp", "not the inventory's"),
        ("mlx-medic probe --host 127.0.0.1 --port 8080 --timeout inf", "not between"),
        ("mlx-medic probe --host 127.0.0.1 --port 80x", "not a TCP port"),
    ],
)
def test_anything_else_is_refused_saying_why(line: str, reason: str) -> None:
    with pytest.raises(Refused) as refused:
        check(line)
    assert reason in str(refused.value)


def test_every_node_helper_but_the_forced_command_itself_is_allowed() -> None:
    for helper in HELPERS:
        if helper == "forced-command":
            continue
        assert check(f"mlx-medic node {helper}")[:2] == ["node", helper]
