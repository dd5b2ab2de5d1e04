"""The forced command's validator: only `mlx-medic node <helper>` and `mlx-medic probe`,
with options whose values the inventory allows; everything else refused, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_medic.inventory import parse_inventory
from mlx_medic.node.cli import HELPERS
from mlx_medic.node.forced_command import Allowed, Refused, helper_names, validate
from tests.node.inventories import two_models

CONFIG = Path("/etc/mlx-medic/inventory.yaml")
INVENTORY = parse_inventory(
    two_models(n1=", medic_command: /opt/mlx-medic/bin/mlx-medic", m2="\n    host: 0.0.0.0")
)
ALLOWED = Allowed(INVENTORY, CONFIG, "n1")


def check(line: str) -> list[str]:
    return validate(line, ALLOWED)


def test_a_node_helper_runs_with_the_keys_own_inventory() -> None:
    assert check("mlx-medic node ledger --json") == [
        "node", "ledger", "--json", "--config.file", str(CONFIG),
    ]  # fmt: skip
    assert check("/opt/mlx-medic/bin/mlx-medic node ledger --node n1 --json")[:5] == [
        "node", "ledger", "--node", "n1", "--json",
    ]  # fmt: skip
    line = f"mlx-medic node ledger --config.file={CONFIG} --state-dir /var/lib/mlx-medic/"
    assert check(line) == ["node", "ledger", f"--config.file={CONFIG}",
                           "--state-dir", "/var/lib/mlx-medic/"]  # fmt: skip


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
        ("mlx-medic node ledger --json; rm -rf /", "unrecognized arguments: --json; rm -rf /"),
        ("mlx-medic node ledger --json ; id", "unrecognized arguments: ; id"),
        ("mlx-medic node ledger && id", "unrecognized arguments: && id"),
        ("mlx-medic node ledger $(id)", "unrecognized arguments: $(id)"),
        ("mlx-medic node ledger 'unclosed", "cannot split"),
        ("/tmp/mlx-medic node ledger", "'/tmp/mlx-medic' is not mlx-medic"),
        ("mlx-medic node reboot", "'node reboot' is not allowed (helpers: backend, clean,"),
        ("mlx-medic node forced-command", "'node forced-command' is not allowed"),
        ("mlx-medic node", "no node helper"),
        ("mlx-medic remediate m1", "'remediate' is not allowed"),
        ("mlx-medic", "no mlx-medic subcommand"),
        ("mlx-medic node ledger --config.file /tmp/evil.yaml", "not the inventory's"),
        ("mlx-medic node ledger --state-dir /etc", "not the inventory's"),
        ("mlx-medic node ledger --state-dir /var/lib/mlx-medic/../../etc", "not the inventory's"),
        ("mlx-medic node ledger --node n9", "--node 'n9' is not this node (n1)"),
        ("mlx-medic node ledger --node n2", "--node 'n2' is not this node (n1)"),
        ("mlx-medic node ledger --node", "argument --node: expected one argument"),
        ("mlx-medic node ledger --json --json", "given twice"),
        ("mlx-medic node ledger --json=yes", "ignored explicit argument 'yes'"),
        ("mlx-medic node ledger --conf /etc/mlx-medic/inventory.yaml", "unrecognized arguments"),
        ("mlx-medic node ledger --help", "unrecognized arguments: --help"),
        ("mlx-medic node run m2 show", "'m2' is not an inventory model placed on n1"),
        ("mlx-medic node run m9 show", "'m9' is not an inventory model placed on n1"),
        ("mlx-medic node run m1 reboot", "invalid choice: 'reboot'"),
        ("mlx-medic node service m1 stop", "required: --by"),
        ("mlx-medic node lock m1 show --config.file /tmp/evil.yaml", "not the inventory's"),
        ("mlx-medic node sweep m1 --start-sweep", "--start-sweep is never allowed"),
        ("mlx-medic node sweep m1 --start-sweep=1", "--start-sweep is never allowed"),
        ("mlx-medic node facts m2", "'m2' is not an inventory model placed on n1"),
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


# One command line per helper, as its callers send it (NodeHelpers adds the same tail).
EXAMPLES = {
    "backend": "m1 set ring --by 'remediator run 12' --reason 'JACCL failed'",
    "clean": "m1 --dry-run",
    "facts": "m1 --lines 5",
    "ledger": "",
    "lock": "m1 take --info '{\"pid\": 1}'",
    "orphans": "m1",
    "pid-alive": "4242 --start-time 1796084792.5",
    "run": "m1 renew r-1 --lease 30 --holder 'serve pid 7 on n1'",
    "service": "m1 stop --by 'remediator run 12' --reason 'model down'",
    "sweep": "m1 --orphans-only --dry-run",
}


def test_every_node_helper_but_the_forced_command_itself_is_allowed() -> None:
    assert "forced-command" not in helper_names()
    assert set(HELPERS) - {"forced-command"} <= set(helper_names())
    assert sorted(EXAMPLES) == helper_names()  # a new helper needs its line here
    tail = f" --config.file {CONFIG} --node n1 --json"
    for helper, args in EXAMPLES.items():
        argv = check(f"mlx-medic node {helper} {args}{tail}")
        assert argv[:2] == ["node", helper] and argv[-5:] == tail.split()


def test_without_this_nodes_name_no_helper_runs() -> None:
    unknown = Allowed(INVENTORY, CONFIG, None, "which inventory node is this? pass --node NAME")
    with pytest.raises(Refused, match=r"this node.s name is unknown \(which inventory node"):
        validate("mlx-medic node ledger --json", unknown)
