"""The sudoers file: exactly the service manager's commands the remediator runs through
`sudo -n` (service_manager.privileged_argv), per label, for the user it logs in as on the
head; accepted by `visudo -cf`, and checked by a real `sudo -n -l` in a private mount
namespace (never this machine's /etc)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_medic.command_line import EXIT_USAGE
from mlx_medic.inventory.load import load_inventory
from mlx_medic.render.sudoers import FILE_NAME as FILE
from mlx_medic.service_manager import privileged_argv
from tests.remediator.private_etc import in_private_etc
from tests.render.helpers import EXAMPLE, model, render, render_example, run, write_inventory
from tests.tools import require_tool


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render_example("sudoers", tmp_path_factory.mktemp("sudoers")) / "sudoers"


def rules(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


def test_visudo_accepts_every_rendered_file_and_each_is_0440(out: Path):
    files = sorted(out.glob("*/mlx-medic"))
    assert [f.parent.name for f in files] == ["ai001", "ai005"]  # the heads
    for path in files:
        result = run(require_tool("visudo"), "-cf", str(path))
        assert result.returncode == 0, result.stdout + result.stderr
        assert path.stat().st_mode & 0o777 == 0o440


def test_each_head_allows_exactly_its_models_privileged_commands_for_its_login_user(out: Path):
    inventory = load_inventory(EXAMPLE)
    for node in ("ai001", "ai005"):
        expected = [
            f"{inventory.node(node).user} ALL=(root) NOPASSWD: {' '.join(argv)}"
            for m in inventory.models
            if m.head == node
            for argv in privileged_argv(m)
        ]
        assert rules(out / node / "mlx-medic") == expected and len(expected) == 3


def test_a_sudoers_separator_in_a_label_is_escaped_and_visudo_accepts_them(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "user": "ops"}},
        {"m1": model("systemd", "mlx:m1")},
    )
    code, _, err = render("sudoers", inventory, tmp_path / "out")
    assert code == 0, err
    path = tmp_path / "out" / "sudoers" / "n1" / "mlx-medic"
    assert r"ops ALL=(root) NOPASSWD: /bin/systemctl stop mlx\:m1" in rules(path)
    assert run(require_tool("visudo"), "-cf", str(path)).returncode == 0


def test_a_supervisord_model_needs_no_sudo_and_gets_no_rule(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml", {"n1": {"ssh": "127.0.0.2"}}, {"m1": model("supervisord", "m1")}
    )
    code, _, err = render("sudoers", inventory, tmp_path / "out")
    assert code == 0, err
    assert not (tmp_path / "out" / "sudoers").exists()


def test_a_plist_path_sudo_would_read_as_a_pattern_is_refused(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2"}},
        {
            "m1": model(
                "launchd",
                "m1",
                service={
                    "manager": "launchd",
                    "label": "m1",
                    "plist": "/Library/LaunchDaemons/m*.plist",
                },
            )
        },
    )
    code, _, err = render("sudoers", inventory, tmp_path / "out")
    assert code == EXIT_USAGE and "models.m1.service" in err and "m*.plist" in err


def test_a_real_sudo_allows_the_remediators_commands_and_refuses_a_neighbour_and_extras(
    out: Path, tmp_path: Path
):
    require_tool("sudo")
    inventory = load_inventory(EXAMPLE)
    glm, qwq = inventory.model("glm-4_6-5b"), inventory.model("qwq-32b-8bit")
    allowed = privileged_argv(glm)
    label = glm.service.label
    refused = [
        *privileged_argv(qwq),  # the neighbour's labels, headed on ai005
        ["/bin/launchctl", "bootout", f"system/{label}", "extra"],
        ["/bin/launchctl", "kickstart", "-k", "-p", f"system/{label}"],
        ["/bin/launchctl", "bootout", f"system/{label}x"],
        ["/bin/launchctl", "bootout"],
        ["/bin/sh", "-c", "id"],
    ]
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "sudoers": str(out / "ai001" / "mlx-medic"),
                "user": inventory.node("ai001").user,
                "stubs": ["/bin/launchctl"],
                "commands": [*allowed, *refused],
            }
        )
    )
    seen = in_private_etc(tmp_path, "check", 240, "tests.render.private_sudo", str(spec))
    codes = [(r["argv"], r["code"]) for r in seen["commands"]]
    assert codes == [(argv, 0) for argv in allowed] + [(argv, 1) for argv in refused], seen
    listing = seen["listing"]["out"]
    assert all(" ".join(argv) in listing for argv in allowed), listing
    assert "qwq" not in listing


# --- the reboot rule ---------------------------------------------------------------------

REBOOT = ["/sbin/shutdown", "-r", "now"]  # the inventory's default reboot command


def reboot_inventory(tmp_path: Path, **reboot: object) -> Path:
    """n1 heads a systemd model; n2 heads nothing and has the given `reboot` section."""
    return write_inventory(
        tmp_path / "inv.yaml",
        {
            "n1": {"ssh": "127.0.0.2", "user": "ops"},
            "n2": {"ssh": "127.0.0.3", "user": "ops", "reboot": reboot},
        },
        {"m1": model("systemd", "m1", nodes=["n1", "n2"])},
    )


def test_the_reboot_rule_is_written_only_for_a_node_with_reboot_allowed(tmp_path: Path):
    off = reboot_inventory(tmp_path)  # the default: off
    assert render("sudoers", off, tmp_path / "off")[0] == 0
    assert sorted(p.parent.name for p in (tmp_path / "off" / "sudoers").glob("*/*")) == ["n1"]
    assert not any("shutdown" in r for r in rules(tmp_path / "off" / "sudoers" / "n1" / FILE))

    on = reboot_inventory(tmp_path, allowed=True)
    assert render("sudoers", on, tmp_path / "on")[0] == 0
    path = tmp_path / "on" / "sudoers" / "n2" / FILE
    assert rules(path) == [f"ops ALL=(root) NOPASSWD: {' '.join(REBOOT)}"]  # that one, no other
    assert run(require_tool("visudo"), "-cf", str(path)).returncode == 0
    assert path.stat().st_mode & 0o777 == 0o440
    assert not any("shutdown" in r for r in rules(tmp_path / "on" / "sudoers" / "n1" / FILE))


def test_the_unkillable_alert_reaches_the_remediator_only_where_a_node_opts_in(tmp_path: Path):
    """reboot-node's alert (per node) is routed to the remediator once a node has
    reboot.allowed; without one it reaches on-call alone, as before the guarded reboot."""
    flags = ("--remediator.url", "https://medic.example:10901")
    for name in ("off", "on"):
        inventory = reboot_inventory(tmp_path, allowed=name == "on")
        code, _, err = render("alertmanager", inventory, tmp_path / name, *flags)
        assert code == 0, err
        text = (tmp_path / name / "alertmanager.yml").read_text()
        assert ('alertname="MLXUnkillableSurvivors"' in text) == (name == "on"), text


def test_the_reboot_rule_names_the_inventorys_own_command(tmp_path: Path):
    inventory = reboot_inventory(tmp_path, allowed=True, command=["/sbin/reboot"])
    assert render("sudoers", inventory, tmp_path / "out")[0] == 0
    path = tmp_path / "out" / "sudoers" / "n2" / FILE
    assert rules(path) == ["ops ALL=(root) NOPASSWD: /sbin/reboot"]
    assert run(require_tool("visudo"), "-cf", str(path)).returncode == 0


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["shutdown", "-r", "now"], "absolute path"),
        (["/sbin/shutdown", "-r", "+1 minute"], "one literal word"),
        (["/sbin/shutdown", "*"], "one literal word"),
        ([], "at least 1 item"),
    ],
)
def test_a_reboot_command_sudo_could_not_name_literally_is_refused(
    tmp_path: Path, command: list[str], said: str
):
    inventory = reboot_inventory(tmp_path, allowed=True, command=command)
    code, _, err = render("sudoers", inventory, tmp_path / "out")
    assert code == EXIT_USAGE and "reboot.command" in err and said in err, err


def test_a_real_sudo_lists_the_reboot_rule_and_refuses_any_other_reboot(tmp_path: Path):
    require_tool("sudo")
    inventory = reboot_inventory(tmp_path, allowed=True)
    assert render("sudoers", inventory, tmp_path / "out")[0] == 0
    refused = [
        ["/sbin/shutdown", "-h", "now"],
        ["/sbin/shutdown", "-r", "now", "extra"],
        ["/sbin/shutdown"],
        ["/sbin/reboot"],
    ]
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "sudoers": str(tmp_path / "out" / "sudoers" / "n2" / FILE),
                "user": "ops",
                "stubs": [],
                "commands": [REBOOT, *refused],
            }
        )
    )
    seen = in_private_etc(tmp_path, "check", 240, "tests.render.private_sudo", str(spec))
    codes = [(r["argv"], r["code"]) for r in seen["commands"]]
    assert codes == [(REBOOT, 0)] + [(argv, 1) for argv in refused], seen
    assert "(root) NOPASSWD: /sbin/shutdown -r now" in seen["listing"]["out"], seen
