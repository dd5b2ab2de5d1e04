"""`mlx-medic doctor --config.file FILE`: from the remediator's host, every node reached as
the remediator reaches it, the read-only form of every helper call its arm makes run
there, and a section per node: `ssh`, one check per call, `versions`. A deployment fault
the arm would meet only when an alert fires (an inventory the helper cannot read,
mlx-medic missing, a forced command that refuses a call, another mlx-medic version) is a
FAIL naming the node, the path and the fix; exit 1. Nodes answer from a fake transport."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.cli import main
from mlx_medic.command_line import EXIT_FAILED, EXIT_OK, EXIT_USAGE, version
from mlx_medic.doctor.commands import helper_call_allowed_as
from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.schema import Inventory, Node
from mlx_medic.node.cli import helper_document
from mlx_medic.remediator import cluster_doctor as cluster
from mlx_medic.transport import CommandResult, TransportError
from tests.remediator.engine_fakes import MODEL, OTHER, inventory_text
from tests.remediator.fake_helpers import DEFAULTS

HELPER_DEFAULTS: dict[str, dict[str, Any]] = {
    **DEFAULTS,
    "lock": {"lock": None},
    "backend": {"choice": "auto"},
    "service": {"stop": None},
    "pid-alive": {"liveness": "alive", "why": "it runs"},
}


class Nodes:
    """A NodeTransport whose nodes answer each helper with its default document, unless
    `faults[(node, helper)]` (or `faults[(node, "*")]`) says what comes back instead: a
    CommandResult, or a TransportError raised. Every (node, argv) sent is in `sent`."""

    def __init__(self, faults: dict[tuple[str, str], CommandResult | TransportError] | None = None):
        self.faults = dict(faults or {})
        self.sent: list[tuple[str, list[str]]] = []

    async def run(self, node: Node, argv: list[str], *, timeout: float) -> CommandResult:
        self.sent.append((node.name, list(argv)))
        helper = argv[2]
        fault = self.faults.get((node.name, helper), self.faults.get((node.name, "*")))
        if isinstance(fault, TransportError):
            raise fault
        if fault is not None:
            return fault
        document = helper_document(helper, HELPER_DEFAULTS.get(helper, {}))
        return CommandResult(0, json.dumps(document) + "\n", "")

    async def close(self) -> None:
        return None


def write_cluster(tmp_path: Path) -> tuple[Path, Inventory]:
    """The remediator's config and its inventory (five nodes, two models)."""
    inventory_path = tmp_path / "inventory.yaml"
    inventory_path.write_text(inventory_text(tmp_path / "state", medic_config=inventory_path))
    config = tmp_path / "remediator.yml"
    config.write_text(yaml.safe_dump({"inventory": str(inventory_path)}))
    return config, load_inventory(inventory_path)


def doctor(
    monkeypatch: pytest.MonkeyPatch, transport: Nodes | None, *argv: str
) -> tuple[int, str, str]:
    if transport is not None:
        monkeypatch.setattr(cluster, "ssh_transport", lambda _inventory: transport)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["doctor", *argv])
    return code, out.getvalue(), err.getvalue()


def checks(output: str) -> dict[tuple[str, str], dict[str, str]]:
    """(node, check name) -> the check, from the JSON report."""
    return {(c["node"], c["name"]): c for c in json.loads(output)["checks"]}


def failures(output: str) -> dict[tuple[str, str], dict[str, str]]:
    return {key: c for key, c in checks(output).items() if c["status"] == "failed"}


def test_a_healthy_cluster_passes_every_call_on_every_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, inventory = write_cluster(tmp_path)
    nodes = Nodes()
    code, out, _ = doctor(monkeypatch, nodes, "--config.file", str(config), "--json")
    found = checks(out)
    assert code == EXIT_OK and not failures(out)
    assert {node for node, _ in found} == {n.name for n in inventory.nodes}
    head = inventory.model(MODEL).head
    assert [name for node, name in found if node == head] == [
        "ssh",
        "pid-alive 1",
        f"facts {MODEL}",
        f"orphans {MODEL}",
        f"sweep {MODEL} --dry-run",
        f"sweep {MODEL} --orphans-only --dry-run",
        f"clean {MODEL} --dry-run",
        f"service {MODEL} status",
        f"backend {MODEL} show",
        f"lock {MODEL} show",
        f"probe {MODEL} --timeout 10",
        "versions",
    ]
    assert found[(head, "versions")]["detail"].startswith(
        f"mlx-medic {version()}, mlx 0.29.1, mlx-lm 0.28.0"
    )
    # a node of a model it does not head gets that model's calls for every node, no more
    assert ("ai004", f"facts {OTHER}") in found
    assert ("ai004", f"lock {OTHER} show") not in found


def test_the_text_report_has_a_section_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = write_cluster(tmp_path)
    code, out, _ = doctor(monkeypatch, Nodes(), "--config.file", str(config))
    lines = out.splitlines()
    assert code == EXIT_OK
    assert [line for line in lines if line.startswith("node ")] == [
        f"node ai00{i}:" for i in range(1, 6)
    ]
    assert f"  config: {config}" in lines
    assert lines[-1].endswith(": ok")


def test_every_call_the_cluster_doctor_sends_is_in_the_read_only_allow_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, inventory = write_cluster(tmp_path)
    nodes = Nodes()
    doctor(monkeypatch, nodes, "--config.file", str(config), "--json")
    assert nodes.sent
    for node, argv in nodes.sent:
        assert helper_call_allowed_as(inventory.node(node), argv) is not None, shlex.join(argv)


def refused(node: str, helper: str) -> dict[tuple[str, str], CommandResult | TransportError]:
    said = f"mlx-medic forced command: refused '{helper} ...': the remediator key never sends it"
    return {(node, helper): CommandResult(2, "", said + "\n")}


@pytest.mark.parametrize(
    ("faults", "check", "detail", "fix"),
    [
        (
            {
                ("ai002", "*"): CommandResult(
                    2,
                    "",
                    "mlx-medic node facts: /etc/mlx-medic/inventory.yaml: cannot read:"
                    " No such file or directory\n",
                )
            },
            f"facts {MODEL}",
            "cannot read its inventory /etc/mlx-medic/inventory.yaml",
            "put the inventory at /etc/mlx-medic/inventory.yaml on ai002",
        ),
        (
            {
                ("ai002", "*"): CommandResult(
                    127, "", "sh: /opt/mlx-medic/bin/mlx-medic: not found\n"
                )
            },
            f"facts {MODEL}",
            "mlx-medic on ai002 is not found at",
            "install mlx-medic on ai002 at",
        ),
        (
            refused("ai001", "lock"),
            f"lock {MODEL} show",
            "ai001's forced command refused the call",
            "render and install authorized-keys for ai001 again",
        ),
        (
            {
                ("ai002", "*"): CommandResult(
                    0, json.dumps({**helper_document("facts", {}), "version": "0.0.1"}) + "\n", ""
                )
            },
            "versions",
            "ai002 runs mlx-medic 0.0.1",
            "upgrade",
        ),
    ],
    ids=["config-unreadable", "helper-missing", "refused", "version-mismatch"],
)
def test_a_misdeployed_node_fails_naming_the_node_the_path_and_the_fix(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    faults: dict[tuple[str, str], CommandResult],
    check: str,
    detail: str,
    fix: str,
) -> None:
    config, _ = write_cluster(tmp_path)
    code, out, _ = doctor(monkeypatch, Nodes(faults), "--config.file", str(config), "--json")
    node = next(iter(faults))[0]
    failed = failures(out)
    assert code == EXIT_FAILED
    assert {n for n, _ in failed} == {node}
    found = failed[(node, check)]
    assert detail in found["detail"] and found["fix"].startswith(fix)


def test_a_refused_call_names_the_authorized_keys_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, inventory = write_cluster(tmp_path)
    _, out, _ = doctor(
        monkeypatch, Nodes(refused("ai001", "lock")), "--config.file", str(config), "--json"
    )
    user = inventory.node("ai001").user
    assert (
        f"~{user}/.ssh/authorized_keys" in failures(out)[("ai001", f"lock {MODEL} show")]["detail"]
    )


@pytest.mark.parametrize(
    ("why", "fix"),
    [
        ("Connection refused", "check that ai003 is up, sshd listens on 127.0.0.4:22"),
        ("Host key is not trusted", "compare 127.0.0.4's host key fingerprint"),
    ],
    ids=["down", "unknown-host-key"],
)
def test_an_unreachable_node_fails_ssh_with_its_fix_and_its_calls_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str, fix: str
) -> None:
    config, _ = write_cluster(tmp_path)
    down = TransportError(f"cannot reach ai003 (ai@127.0.0.4:22): {why}")
    code, out, _ = doctor(
        monkeypatch, Nodes({("ai003", "*"): down}), "--config.file", str(config), "--json"
    )
    found = checks(out)
    assert code == EXIT_FAILED
    assert set(failures(out)) == {("ai003", "ssh")}
    assert why in found[("ai003", "ssh")]["detail"]
    assert found[("ai003", "ssh")]["fix"].startswith(fix)
    assert {c["status"] for (n, name), c in found.items() if n == "ai003" and name != "ssh"} == {
        "skipped"
    }


def test_an_unknown_host_key_is_fixed_by_the_keyscan_into_the_pinned_known_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = write_cluster(tmp_path)
    changed = TransportError("cannot reach ai003 (ai@127.0.0.4:22): Host key is not trusted")
    _, out, _ = doctor(
        monkeypatch, Nodes({("ai003", "*"): changed}), "--config.file", str(config), "--json"
    )
    assert (
        "put `ssh-keyscan -p 22 127.0.0.4` in ~/.ssh/known_hosts"
        in (failures(out)[("ai003", "ssh")]["fix"])
    )


def test_config_file_and_inventory_together_is_exit_2_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = write_cluster(tmp_path)
    code, out, err = doctor(
        monkeypatch, None, "--config.file", str(config), "--inventory", str(tmp_path / "i.yaml")
    )
    assert code == EXIT_USAGE and out == ""
    assert err.count("\n") == 1 and "give one" in err


def test_a_config_that_cannot_be_read_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = doctor(monkeypatch, None, "--config.file", str(tmp_path / "missing.yml"))
    assert code == EXIT_USAGE and "missing.yml" in err


def test_the_help_names_the_inventory_for_this_node_and_the_config_for_every_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert "--inventory FILE" in usage and "--config.file FILE" in usage


def test_node_with_config_file_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = write_cluster(tmp_path)
    code, _, err = doctor(monkeypatch, None, "--config.file", str(config), "--node", "ai001")
    assert code == EXIT_USAGE and "--node" in err


def test_a_call_outside_the_allow_list_is_never_sent_and_fails_as_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = write_cluster(tmp_path)
    monkeypatch.setattr(cluster, "LOCK_PID_CALL", ("service", MODEL, "stop"))
    nodes = Nodes()
    code, out, _ = doctor(monkeypatch, nodes, "--config.file", str(config), "--json")
    failed = failures(out)
    assert code == EXIT_FAILED and failed
    assert all(name == f"service {MODEL} stop" for _, name in failed)
    assert all("may not send" in c["detail"] and "bug" in c["fix"] for c in failed.values())
    assert not [argv for _, argv in nodes.sent if "stop" in argv]
