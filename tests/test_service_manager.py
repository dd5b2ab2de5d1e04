"""The service manager's commands: one exact argument list per manager and action, the
ones a sudoers rule must allow, and nothing built from anything but the inventory."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.service_manager import SERVICE_ACTIONS, privileged_argv, service_argv


def model(service: dict[str, Any]):
    inventory = parse_inventory(
        yaml.safe_dump(
            {
                "nodes": {"n1": {"ssh": "127.0.0.2"}},
                "models": {
                    "m1": {
                        "model": "/m",
                        "nodes": ["n1"],
                        "port": 8080,
                        "service": service,
                        "backends": {"ring": {"hostfile": "/etc/ring.json"}},
                    }
                },
            }
        )
    )
    return inventory.model("m1")


def test_launchd_stops_by_bootout_starts_from_the_inventorys_plist_and_restarts_by_kickstart():
    plist = "/Library/LaunchDaemons/x.plist"
    m = model({"manager": "launchd", "label": "com.x.m1", "plist": plist})
    assert service_argv(m, "stop") == ["sudo", "-n", "/bin/launchctl", "bootout", "system/com.x.m1"]
    assert service_argv(m, "start") == [
        "sudo",
        "-n",
        "/bin/launchctl",
        "bootstrap",
        "system",
        plist,
    ]
    assert service_argv(m, "restart") == [
        "sudo",
        "-n",
        "/bin/launchctl",
        "kickstart",
        "-k",
        "system/com.x.m1",
    ]


def test_launchd_plist_defaults_to_the_label_under_library_launchdaemons():
    m = model({"manager": "launchd", "label": "com.x.m1"})
    assert service_argv(m, "start")[-1] == "/Library/LaunchDaemons/com.x.m1.plist"


def test_systemd_goes_through_sudo_and_supervisord_through_its_own_socket():
    assert service_argv(model({"manager": "systemd", "label": "m1.service"}), "stop") == [
        "sudo",
        "-n",
        "/bin/systemctl",
        "stop",
        "m1.service",
    ]
    sup = model({"manager": "supervisord", "label": "m1", "config": "/etc/sup.conf"})
    assert service_argv(sup, "restart") == ["supervisorctl", "-c", "/etc/sup.conf", "restart", "m1"]
    assert privileged_argv(sup) == []


def test_privileged_argv_is_every_sudo_command_without_sudo():
    m = model({"manager": "launchd", "label": "com.x.m1"})
    assert privileged_argv(m) == [service_argv(m, a)[2:] for a in SERVICE_ACTIONS]


@pytest.mark.parametrize("field", ["plist", "config"])
def test_a_relative_service_file_is_refused(field: str):
    with pytest.raises(ValueError, match="absolute path"):
        model({"manager": "launchd", "label": "x", field: "x.plist"})
