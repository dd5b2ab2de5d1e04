"""The inventory: one file describes the cluster, and a bad one is refused
with errors that name the line and the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlx_medic.inventory.load import load_inventory, parse_inventory
from mlx_medic.inventory.methods import InventoryError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "inventory.yaml"

GOOD = """\
nodes:
  a: {ssh: 127.0.0.2}
  b: {ssh: 127.0.0.3}
models:
  m:
    model: /models/tiny
    nodes: [a, b]
    port: 8080
    service: {manager: supervisord, label: m}
    backends: {ring: {hostfile: /etc/ring.json, pipeline: true}}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml")
    return caught.value.problems


def test_the_example_inventory_describes_the_seed_cluster() -> None:
    inventory = load_inventory(EXAMPLE)
    assert [n.name for n in inventory.nodes] == ["ai001", "ai002", "ai003", "ai004", "ai005"]
    glm = inventory.model("glm-4_6-5b")
    assert glm.nodes == ["ai001", "ai002", "ai003", "ai004"] and glm.head == "ai001"
    assert [name for name, _ in glm.backends.in_order()] == ["jaccl", "ring"]
    assert glm.backends.ring is not None and glm.backends.ring.pipeline
    assert glm.service.manager == "launchd"
    assert glm.serve_flags() == ["--prefill-step-size", "2048"]
    assert len(inventory.model("qwq-32b-8bit").nodes) == 2
    assert [m.name for m in inventory.models_on("ai004")] == ["glm-4_6-5b", "qwq-32b-8bit"]


def test_a_service_user_is_a_user_name_and_a_bad_one_is_named_with_its_line() -> None:
    inventory = parse_inventory(GOOD.replace("label: m}", "label: m, user: ai}"))
    assert inventory.model("m").service.user == "ai"
    assert parse_inventory(GOOD).model("m").service.user is None  # the exporter's own user
    found = problems(GOOD.replace("label: m}", "label: m, user: 'ai; rm -rf /'}"))
    assert len(found) == 1 and found[0].startswith(
        "line 9, column 47: models.m.service.user: 'ai; rm -rf /': String should match"
    )


def test_durations_accept_units() -> None:
    inventory = parse_inventory(
        GOOD.replace("port: 8080", "port: 8080\n    policy: {window: 2h, backoff: 90}")
    )
    assert inventory.model("m").policy.window == 7200
    assert inventory.model("m").policy.backoff == 90


def test_an_unknown_field_is_named_with_its_line() -> None:
    found = problems(GOOD.replace("port: 8080", "port: 8080\n    prefill: 2048"))
    assert found == ["line 9, column 5: models.m.prefill: 2048: unknown field (check the spelling)"]


def test_a_bad_value_names_the_field_and_the_reason() -> None:
    found = problems(GOOD.replace("port: 8080", "port: 99999"))
    assert len(found) == 1
    assert (
        found[0]
        == "line 8, column 5: models.m.port: 99999: Input should be less than or equal to 65535"
    )


def test_a_rank_on_an_unknown_node_is_contradictory() -> None:
    found = problems(GOOD.replace("nodes: [a, b]", "nodes: [a, c]"))
    assert "unknown node 'c'" in found[0]


def test_two_models_cannot_serve_on_the_same_head_and_port() -> None:
    second = GOOD.split("models:\n")[1].replace("  m:", "  n:")
    found = problems(GOOD + second)
    assert "both serve on a:8080" in found[0]


def test_a_node_listed_twice_in_a_model_is_refused() -> None:
    found = problems(GOOD.replace("nodes: [a, b]", "nodes: [a, a]"))
    assert "line 7, column 5: models.m.nodes" in found[0] and "listed twice" in found[0]


def test_a_model_without_any_backend_is_refused() -> None:
    found = problems(
        GOOD.replace("backends: {ring: {hostfile: /etc/ring.json, pipeline: true}}", "backends: {}")
    )
    assert "models.m.backends" in found[0] and "at least one backend" in found[0]


def test_relative_or_parent_paths_are_refused_for_dirs_that_get_cleaned() -> None:
    assert "absolute" in problems(GOOD + "    tmp_dirs: [cache/tmp]\n")[0]
    assert "'..'" in problems(GOOD + "    tmp_dirs: [/var/../etc]\n")[0]
    assert "'/' is not" in problems(GOOD + "    tmp_dirs: [/]\n")[0]


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        (
            "a: {ssh: 127.0.0.2}",
            "a: {ssh: 127.0.0.2, medic_config: PATH}",
            "line 2, column 23: nodes.a.medic_config",
        ),
        ("label: m}", "label: m, plist: PATH}", "line 9, column 47: models.m.service.plist"),
        ("label: m}", "label: m, config: PATH}", "line 9, column 47: models.m.service.config"),
        (
            "port: 8080",
            "port: 8080\n    serve: {python: PATH}",
            "line 9, column 13: models.m.serve.python",
        ),
        (
            "port: 8080",
            "port: 8080\n    serve: {identity_file: PATH}",
            "line 9, column 13: models.m.serve.identity_file",
        ),
    ],
)
@pytest.mark.parametrize("path", ["etc/mlx-medic/inventory.yaml", "/etc/../root/x"])
def test_a_file_the_inventory_names_on_a_node_is_an_absolute_path_without_parents(
    old: str, new: str, where: str, path: str
) -> None:
    found = problems(GOOD.replace(old, new.replace("PATH", path)))
    assert found == [f"{where}: {path!r} must be an absolute path without '..'"]


def test_names_that_could_escape_a_path_or_label_are_refused() -> None:
    found = problems(GOOD.replace("  m:\n", "  ../m:\n"))
    assert "models.../m.name" in found[0]


def test_an_ssh_address_that_looks_like_an_option_is_refused() -> None:
    found = problems(GOOD.replace("{ssh: 127.0.0.2}", "{ssh: -oProxyCommand=x}"))
    assert "nodes.a.ssh" in found[0]


def test_yaml_syntax_errors_name_the_line() -> None:
    found = problems("nodes:\n  a: {ssh: [\n")
    assert found[0].startswith("line ") and "not valid YAML" in found[0]


def test_empty_and_non_mapping_files_are_explained() -> None:
    assert "empty" in problems("")[0]
    assert "top level" in problems("- a\n- b\n")[0]


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path / "missing.yaml")
    assert "missing.yaml" in str(caught.value) and "cannot read" in str(caught.value)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_check_config_accepts_the_example() -> None:
    result = run_cli("check-config", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "ok: 5 nodes, 2 models" in result.stdout


def test_check_config_lists_every_problem_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("port: 8080", "port: eighty\n    colour: blue"))
    result = run_cli("check-config", str(bad))
    assert result.returncode == 1
    assert "2 problem(s)" in result.stderr
    assert (
        "line 8, column 5: models.m.port: eighty: Input should be a valid integer" in result.stderr
    )
    assert "line 9, column 5: models.m.colour: blue: unknown field" in result.stderr


def test_the_exporter_does_not_start_on_a_bad_inventory(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("nodes: [a, b]", "nodes: [a, z]"))
    result = run_cli("exporter", "--inventory", str(bad), "--node", "a", "--once")
    assert result.returncode == 2
    assert "unknown node 'z'" in result.stderr
    assert "# HELP" not in result.stdout


def test_the_exporter_refuses_a_node_the_inventory_does_not_name(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    result = run_cli("exporter", "--inventory", str(good), "--node", "q", "--once")
    assert result.returncode == 2
    assert "--node 'q' is not in the inventory (nodes: a, b)" in result.stderr


def test_the_login_user_is_a_named_user_never_root_by_default() -> None:
    assert [n.user for n in parse_inventory(GOOD).nodes] == ["mlx-medic", "mlx-medic"]
    site = GOOD.replace(
        "nodes:\n  a: {ssh: 127.0.0.2}",
        "ssh: {user: medic}\nnodes:\n  a: {ssh: 127.0.0.2, user: ai}",
    )
    assert [n.user for n in parse_inventory(site).nodes] == ["ai", "medic"]  # a's own, else ssh's
    found = problems(GOOD.replace("nodes:\n", "ssh: {user: 'root; id'}\nnodes:\n"))
    assert len(found) == 1 and found[0].startswith(
        "line 1, column 7: ssh.user: 'root; id':"
    )  # said once, where written


@pytest.mark.parametrize(
    "address", ["10.0.0.5", "10.0.0.0/24", "fd00::1", "fd00::/64", "remediator.example"]
)
def test_the_remediators_addresses_are_ips_networks_or_host_names(address: str) -> None:
    text = GOOD.replace("nodes:\n", f"ssh: {{remediator_addresses: ['{address}']}}\nnodes:\n")
    assert parse_inventory(text).ssh.remediator_addresses == [address]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.0.0.5/24", "has host bits set"),
        ("10.0.0.300", "is not an IP address or network"),
        ("*.example", "no wildcards"),
        ("10.0.0.5,10.0.0.6", "no wildcards"),
        ('a" command="sh', "no wildcards"),
    ],
)
def test_an_address_sshd_would_read_otherwise_is_refused(address: str, why: str) -> None:
    text = GOOD.replace("nodes:\n", "ssh: {remediator_addresses: [X]}\nnodes:\n")
    found = problems(text.replace("[X]", f"[{address!r}]"))
    assert len(found) == 1 and "ssh.remediator_addresses[0]" in found[0] and why in found[0]


def test_check_config_refuses_a_root_login_unless_the_inventory_allows_it(tmp_path: Path) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(GOOD.replace("a: {ssh: 127.0.0.2}", "a: {ssh: 127.0.0.2, user: root}"))
    result = run_cli("check-config", str(inventory))
    assert result.returncode == 1 and "ok:" not in result.stdout
    assert "nodes.<name>.user: root is the SSH login user on a:" in result.stderr
    assert "ssh.allow_root_login: true" in result.stderr
    inventory.write_text(GOOD.replace("nodes:\n", "ssh: {user: root}\nnodes:\n"))
    result = run_cli("check-config", str(inventory))
    assert result.returncode == 1
    assert "ssh.user: root is the SSH login user on a, b" in result.stderr
    inventory.write_text(
        GOOD.replace("nodes:\n", "ssh: {user: root, allow_root_login: true}\nnodes:\n")
    )
    assert run_cli("check-config", str(inventory)).returncode == 0


def test_check_config_warns_when_a_service_user_is_not_its_nodes_login_user(
    tmp_path: Path,
) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        GOOD.replace("label: m}", "label: m, user: ai}").replace(
            "b: {ssh: 127.0.0.3}", "b: {ssh: 127.0.0.3, user: ai}"
        )
    )
    result = run_cli("check-config", str(inventory))
    assert result.returncode == 0 and "ok: 2 nodes, 1 models" in result.stdout
    assert (
        "warning: models.m.service.user is ai, but the login user of a is mlx-medic"
        in result.stderr
    ) and "cannot signal ai's ranks" in result.stderr
    assert "warning" not in run_cli("check-config", str(EXAMPLE)).stderr  # ai logs in, ai serves
