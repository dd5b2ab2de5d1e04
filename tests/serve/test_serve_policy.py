"""The wrapper's policies, each on its own: the ring pin mlx-medic set itself is lifted
once a node rebooted (a person's never is), when JACCL will be tried again, the relaunch
budget and interval, a down port named as a link fault, ring's --pipeline by default,
and check-config refusing the testbed's simulated JACCL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlx_medic.platform.macos_rdma import parse_ibv_devinfo
from mlx_medic.serve.backend import fail_back, pin_ring_again
from mlx_medic.serve.relaunch import Relaunches
from mlx_medic.serve.smoke import link_fault
from mlx_medic.state.backend_choice import read_backend_choice, write_backend_choice
from tests.serve.inventories import inventory

FIXTURES = Path(__file__).parent.parent / "fixtures" / "macos"
INVENTORY_TEXT = """\
state_dir: {state}
nodes: {{ai001: {{ssh: 127.0.0.2}}}}
models:
  tiny:
    model: /models/tiny
    nodes: [ai001]
    port: 8123
    service: {{manager: supervisord, label: tiny-svc}}
    backends: {{jaccl: {{hostfile: /etc/jaccl.json}}}}
    serve: {{simulated_jaccl: true}}
"""


def model(tmp_path: Path, serve: str = "{}"):
    return inventory(tmp_path, serve=serve).model("tiny")


BOOTS = {"ai001": "boot-a1", "ai002": "boot-b1"}


def test_a_ring_pin_mlx_medic_set_is_stamped_then_lifted_once_a_node_has_rebooted(tmp_path):
    tiny = model(tmp_path)
    pin = write_backend_choice(
        tmp_path, "tiny", "ring", by="remediator run 7", reason="JACCL failed on ai002"
    )
    stamped, said = fail_back(tmp_path, tiny, pin, BOOTS)
    assert (stamped.choice, stamped.boots, said) == ("ring", BOOTS, None)
    assert read_backend_choice(tmp_path, "tiny").boots == BOOTS  # kept on the head
    same, said = fail_back(tmp_path, tiny, stamped, BOOTS)  # no reboot: nothing changes
    assert (same.choice, said) == ("ring", None)

    lifted, said = fail_back(tmp_path, tiny, stamped, {**BOOTS, "ai002": "boot-b2"})
    assert lifted.choice == "auto" and lifted.by == "mlx-medic serve"
    assert said is not None and said.startswith("ai002 rebooted since remediator run 7 pinned")
    assert read_backend_choice(tmp_path, "tiny").choice == "auto"

    # JACCL fails again after the lift: ring until the next reboot, stamped with this boot.
    pin_ring_again(tmp_path, tiny, {**BOOTS, "ai002": "boot-b2"}, "jaccl failed on ai002")
    again = read_backend_choice(tmp_path, "tiny")
    assert (again.choice, again.automatic, again.boots["ai002"]) == ("ring", True, "boot-b2")
    assert fail_back(tmp_path, tiny, again, {**BOOTS, "ai002": "boot-b2"})[1] is None


def test_a_pin_a_person_set_is_never_lifted(tmp_path):
    tiny = model(tmp_path)
    pin = write_backend_choice(
        tmp_path, "tiny", "ring", by="ana@ops1 at a terminal", reason="cable work", boots=BOOTS
    )
    kept, said = fail_back(tmp_path, tiny, pin, {"ai001": "new", "ai002": "new"})
    assert (kept, said) == (pin, None)
    assert "a person pinned ring" in kept.retry()
    assert "unpin with `mlx-medic backend MODEL auto`" in kept.retry()


def test_the_choice_says_when_jaccl_will_be_tried_again(tmp_path):
    auto = read_backend_choice(tmp_path, "tiny")
    assert auto.retry() == "JACCL is tried first at every start while the ledger allows it"
    pin = write_backend_choice(
        tmp_path, "tiny", "ring", by="remediator run 7", reason="x", boots=BOOTS
    )
    assert pin.retry() == (
        "JACCL is tried again once one of ai001, ai002 has rebooted"
        " (mlx-medic lifts its own ring pin once per reboot)"
    )


def test_relaunches_are_bounded_per_window_and_spaced_like_launchds_throttle():
    now = [0.0]
    relaunches = Relaunches(limit=2, window=60.0, interval=10.0, clock=lambda: now[0])
    assert relaunches.allow()
    relaunches.record()
    relaunches.record()
    assert not relaunches.allow() and relaunches.used == 2
    now[0] = 61.0
    assert relaunches.allow() and relaunches.used == 0  # the window moved on
    assert relaunches.not_before(launched_at=55.0) == 65.0  # the last launch + interval
    assert relaunches.not_before(launched_at=None) == 0.0
    assert not Relaunches(limit=0, window=60.0, interval=10.0).allow()


def test_a_down_port_turns_a_protection_domain_error_into_a_link_fault():
    down = parse_ibv_devinfo((FIXTURES / "ibv_devinfo_m5max_tabs.txt").read_text())
    said = link_fault(("rdma_en1",), lambda: down)
    assert said.startswith(" (link fault: rdma_en1 port 1 PORT_DOWN;")
    assert "reseat the cable" in said
    active = parse_ibv_devinfo((FIXTURES / "ibv_devinfo_tn3205.txt").read_text())
    assert link_fault(("rdma_en2",), lambda: active) == ""
    assert link_fault(("rdma_en1",), lambda: None) == ""  # no ibv_devinfo here (Linux)


def test_ring_pipelines_by_default_and_a_model_can_turn_it_off(tmp_path):
    assert dict(model(tmp_path).backends.in_order())["jaccl"].pipeline is False
    bare = inventory(tmp_path, "{jaccl: {hostfile: /etc/j.json}, ring: {hostfile: /etc/r.json}}")
    assert dict(bare.model("tiny").backends.in_order())["ring"].pipeline is True
    off = inventory(tmp_path, "{ring: {hostfile: /etc/ring.json, pipeline: false}}")
    assert dict(off.model("tiny").backends.in_order())["ring"].pipeline is False


def test_check_config_refuses_the_simulated_jaccl_outside_a_testbed(tmp_path):
    path = tmp_path / "inventory.yaml"
    inventory(tmp_path, serve="{simulated_jaccl: true}")  # valid as an inventory
    path.write_text(INVENTORY_TEXT.format(state=tmp_path))

    def check(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mlx_medic.cli", "check-config", str(path), *flags],
            capture_output=True,
            text=True,
        )

    refused = check()
    assert refused.returncode == 1
    assert "models.tiny.serve.simulated_jaccl: true" in refused.stderr
    assert "--allow-simulated-jaccl" in refused.stderr
    assert check("--allow-simulated-jaccl").returncode == 0


def test_the_backend_command_says_who_pinned_why_and_when_jaccl_is_tried_again(tmp_path):
    from mlx_medic.node.backend_cli import describe

    write_backend_choice(
        tmp_path,
        "tiny",
        "ring",
        by="remediator run 7",
        reason="jaccl failed",
        boots={"ai001": "b1"},
    )
    said = describe("tiny", read_backend_choice(tmp_path, "tiny"))
    assert said.startswith("tiny: pinned to ring, by remediator run 7 at ")
    assert said.endswith(
        ": jaccl failed; JACCL is tried again once one of ai001 has rebooted"
        " (mlx-medic lifts its own ring pin once per reboot)"
    )
