"""Duplicate ranks by launch placement, the evidence that tells the current one, and
suspects kept apart from orphans; on synthetic tables shaped like the seed's cluster.

What mlx.launch hands a ring rank (launch.py make_launch_script): `MLX_RANK` and
`MLX_HOSTFILE`, the path of a mktemp file whose content is every rank's ip:port list.
"""

from __future__ import annotations

import pytest

from mlx_medic.processes.info import ProcessInfo, State
from mlx_medic.processes.orphans import Rule, SuspectRule
from mlx_medic.processes.placement import (
    Placement,
    placement_from,
    placement_of_env,
    placement_of_ssh_client,
)
from tests.exporter.process_tables import (
    GLM_RING,
    INVENTORY,
    SSHD_LISTENER,
    SSHD_SESSION,
    launched_env,
    launcher_argv,
    proc,
    rank_argv,
    ssh_client_argv,
    table,
)
from tests.exporter.test_orphan_rules import judge, orphan_rules, suspect_rules

OTHER_PORTS = '[["192.168.101.1:40000"], ["192.168.101.2:40001"]]\n'
FILES = {
    "/var/folders/T/tmp.AAAA": GLM_RING,
    "/var/folders/T/tmp.BBBB": GLM_RING,
    "/var/folders/T/tmp.CCCC": OTHER_PORTS,
}


def seed_peer(*, second_hostfile: str = "/var/folders/T/tmp.BBBB") -> list[ProcessInfo]:
    """ai002 after mlx.launch was SIGKILLed and the service started the model again: two
    rank-1 processes, each under its own sshd session, each handed its own temporary
    hostfile; the dead launch's ssh client still lives on ai001, so both sessions hold a
    client."""
    return table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(100, 1, SSHD_LISTENER),
        proc(200, 100, SSHD_SESSION, name="sshd"),
        proc(
            201,
            200,
            rank_argv(),
            env=launched_env(1, "/var/folders/T/tmp.AAAA"),
            created=1000,
            state=State.UNINTERRUPTIBLE,
        ),
        proc(300, 100, SSHD_SESSION, name="sshd"),
        proc(301, 300, rank_argv(), env=launched_env(1, second_hostfile), created=2000),
    )


def lingering_attempt_on_the_head() -> list[ProcessInfo]:
    """ai001: the first launch's mlx.launch was SIGKILLed, its rank 0 still serves port
    8080; a second launch attempt on the same placement failed to bind the port (its rank
    0 hangs on, as mlx_lm.server does: its generation thread keeps the process up) and
    its mlx.launch waits for it."""
    return table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env=launched_env(0, "/var/folders/T/tmp.AAAA"), created=1000),
        proc(
            11,
            1,
            ssh_client_argv("192.168.101.2", 1, rank_argv(), hostfile=GLM_RING.strip()),
            created=1000,
        ),
        proc(20, 1, launcher_argv(rank_argv()), created=2000),
        proc(21, 20, rank_argv(), env=launched_env(0, "/var/folders/T/tmp.BBBB"), created=2000),
        proc(
            22,
            20,
            ssh_client_argv("192.168.101.2", 1, rank_argv(), hostfile=GLM_RING.strip()),
            created=2000,
        ),
    )


# --- the placement ------------------------------------------------------------------------


def test_the_placement_is_the_hostfiles_content_not_its_temporary_path():
    first = placement_of_env(launched_env(1, "/var/folders/T/tmp.AAAA"), FILES.get)
    second = placement_of_env(launched_env(1, "/var/folders/T/tmp.BBBB"), FILES.get)
    other = placement_of_env(launched_env(1, "/var/folders/T/tmp.CCCC"), FILES.get)
    assert first == second == Placement(first.key, rank=1, size=2, ranks_here=1)
    assert other is not None and other.key != first.key  # other ports: another launch


def test_the_placement_says_how_many_ranks_the_launch_puts_on_the_ranks_host():
    two_here = '[["10.0.0.1:5000"], ["10.0.0.1:5001"], ["10.0.0.2:5002"]]'
    assert placement_from("0", hostfile=two_here).ranks_here == 2
    assert placement_from("1", hostfile=two_here).ranks_here == 2
    assert placement_from("2", hostfile=two_here).ranks_here == 1


def test_a_jaccl_placement_is_the_coordinator_and_the_device_matrix():
    devices = '[[null, "rdma_en3"], ["rdma_en3", null]]'
    one = placement_from("1", devices=devices, coordinator="192.168.101.1:32323")
    again = placement_from("1", devices=devices + "\n", coordinator="192.168.101.1:32323")
    elsewhere = placement_from("1", devices=devices, coordinator="192.168.101.5:32323")
    assert one == again and one.size == 2 and one.ranks_here == 1
    assert elsewhere is not None and elsewhere.key != one.key


@pytest.mark.parametrize(
    "env,files",
    [
        ({"MLX_RANK": "0", "MLX_HOSTFILE": "/t/x"}, {"/t/x": ""}),  # a one-rank launch
        ({"MLX_RANK": "0"}, {}),  # MLX_RANK set by hand: no placement handed
        ({"MLX_RANK": "1", "MLX_HOSTFILE": "/t/gone"}, {}),  # cleaned away: unreadable
        ({"MLX_RANK": "7", "MLX_HOSTFILE": "/t/x"}, {"/t/x": GLM_RING}),  # not a rank of it
        ({"MLX_RANK": "one", "MLX_HOSTFILE": "/t/x"}, {"/t/x": GLM_RING}),
        ({"MLX_RANK": "1", "MLX_HOSTFILE": "/t/x"}, {"/t/x": "not json"}),
    ],
)
def test_no_placement_is_made_up_where_the_launch_handed_none_that_two_launches_share(env, files):
    assert placement_of_env(env, files.get) is None


def test_an_ssh_client_carries_the_placement_of_the_rank_it_starts():
    client = ssh_client_argv("192.168.101.2", 1, rank_argv(), hostfile=GLM_RING.strip())
    assert placement_of_ssh_client(tuple(client)) == placement_of_env(
        launched_env(1, "/var/folders/T/tmp.AAAA"), FILES.get
    )


# --- duplicate ranks --------------------------------------------------------------------


@pytest.mark.parametrize("inventory", [None, INVENTORY], ids=["discovery", "inventory"])
def test_the_seeds_peer_orphan_is_found_as_two_ranks_of_one_placement_and_rank_number(inventory):
    """Both sessions hold a client and no peer rank serves HTTP: nothing on the peer tells
    which launch is current, so both are suspects, with or without an inventory."""
    report = judge(
        seed_peer(), node=None if inventory is None else "ai002", files=FILES, inventory=inventory
    )
    assert orphan_rules(report) == {}
    assert suspect_rules(report) == {
        201: SuspectRule.DUPLICATE_RANK_UNDECIDED,
        301: SuspectRule.DUPLICATE_RANK_UNDECIDED,
    }


def test_without_an_inventory_ranks_of_two_placements_may_both_be_current():
    report = judge(
        seed_peer(second_hostfile="/var/folders/T/tmp.CCCC"), node=None, files=FILES, inventory=None
    )
    assert report.orphans == [] and report.suspects == []


def test_once_the_dead_launchs_client_is_gone_its_peer_rank_is_the_orphan():
    report = judge(
        seed_peer(),
        node=None,
        files=FILES,
        inventory=None,
        established=lambda sshd: sshd.pid == 300,
    )
    assert orphan_rules(report) == {201: Rule.SSH_CLIENT_LOST}
    assert report.suspects == []


def test_where_a_session_cannot_be_read_the_duplicates_stay_suspects():
    report = judge(
        seed_peer(),
        node=None,
        files=FILES,
        inventory=None,
        established=lambda sshd: True if sshd.pid == 300 else None,
    )
    assert orphan_rules(report) == {}
    assert set(suspect_rules(report)) == {201, 301}


@pytest.mark.parametrize("inventory", [None, INVENTORY], ids=["discovery", "inventory"])
def test_a_lingering_failed_attempt_never_marks_the_rank_that_serves(inventory):
    """The newer rank 0 has a live launcher, the older one none: by age or by launcher the
    serving rank would be the orphan. It listens on the model's port: it is the current
    one, the failed attempt is the duplicate, and the dead launch's ssh client, which holds
    the serving run's peer rank, is kept."""
    report = judge(
        lingering_attempt_on_the_head(),
        node=None if inventory is None else "ai001",
        files=FILES,
        inventory=inventory,
        listening={10: {8080}},
    )
    assert orphan_rules(report) == {21: Rule.DUPLICATE_RANK}
    assert report.suspects == []
    assert not report.suspected_remote


def test_the_same_head_without_the_serving_rank_calls_the_dead_launch_what_it_is():
    processes = [p for p in lingering_attempt_on_the_head() if p.pid != 10]
    report = judge(processes, node="ai001", files=FILES)
    assert orphan_rules(report) == {11: Rule.LAUNCHER_GONE}
    assert report.suspected_remote == {("glm", "ai002"): 1}


def test_a_serving_rank_whose_launcher_is_gone_is_never_an_orphan():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env=launched_env(0, "/var/folders/T/tmp.AAAA")),
    )
    assert orphan_rules(judge(processes, node="ai001", files=FILES)) == {10: Rule.LAUNCHER_GONE}
    report = judge(processes, node="ai001", files=FILES, listening={10: {8080}})
    assert report.orphans == [] and report.suspects == []


def test_listening_on_another_port_is_not_serving_the_model():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env=launched_env(0, "/var/folders/T/tmp.AAAA")),
    )
    report = judge(processes, node="ai001", files=FILES, listening={10: {9999}})
    assert orphan_rules(report) == {10: Rule.LAUNCHER_GONE}


def test_two_dead_launches_beside_the_serving_one_leave_their_clients_undecided():
    processes = [
        *lingering_attempt_on_the_head()[:3],
        proc(
            12,
            1,
            ssh_client_argv("192.168.101.2", 1, rank_argv(), hostfile=GLM_RING.strip()),
            created=500,
        ),
    ]
    report = judge(processes, node="ai001", files=FILES, listening={10: {8080}})
    assert report.orphans == []
    assert suspect_rules(report) == {
        11: SuspectRule.DUPLICATE_RANK_UNDECIDED,
        12: SuspectRule.DUPLICATE_RANK_UNDECIDED,
    }


def test_share_ranks_and_server_ranks_of_one_placement_are_not_duplicates_of_each_other():
    share = [
        "python3",
        "-m",
        "mlx_lm",
        "share",
        "--model",
        "x",
        "--tmpdir",
        "/Users/ai/.cache/mlx-share/glm/t",
    ]
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(100, 1, SSHD_LISTENER),
        proc(200, 100, SSHD_SESSION, name="sshd"),
        proc(201, 200, rank_argv(), env=launched_env(1, "/var/folders/T/tmp.AAAA")),
        proc(300, 100, SSHD_SESSION, name="sshd"),
        proc(301, 300, share, env=launched_env(1, "/var/folders/T/tmp.BBBB")),
    )
    report = judge(processes, node="ai002", files=FILES)
    assert report.orphans == [] and report.suspects == []


# --- excess ranks, told by the same evidence --------------------------------------------


def test_a_launch_that_places_two_ranks_here_makes_neither_excess_when_the_inventory_says_one():
    two_here = '[["192.168.101.1:5000"], ["192.168.101.1:5001"]]'
    files = {"/t/a": two_here, "/t/b": two_here}
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(5, 1, launcher_argv(rank_argv())),
        proc(10, 5, rank_argv(), env=launched_env(0, "/t/a")),
        proc(11, 5, rank_argv(), env=launched_env(1, "/t/b")),
    )
    assert INVENTORY.model("glm").ranks_per_node == 1
    report = judge(processes, node="ai001", files=files)
    assert report.orphans == [] and report.suspects == []


def test_excess_ranks_keep_the_one_that_serves_not_the_newest():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), created=1000),
        proc(11, 1, rank_argv(), created=2000),
    )
    report = judge(processes, node="ai001", listening={10: {8080}})
    assert orphan_rules(report) == {11: Rule.EXCESS_RANKS}
    report = judge(processes, node="ai001")
    assert orphan_rules(report) == {}
    assert suspect_rules(report) == {
        10: SuspectRule.EXCESS_RANKS_UNDECIDED,
        11: SuspectRule.EXCESS_RANKS_UNDECIDED,
    }


def test_on_a_node_the_model_does_not_use_even_a_serving_rank_is_left_alone():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]), proc(10, 1, rank_argv()), proc(11, 1, rank_argv())
    )
    report = judge(processes, node="ai003", listening={10: {8080}})
    assert orphan_rules(report) == {11: Rule.EXCESS_RANKS}


# --- the report a sweep reads -------------------------------------------------------------


def test_suspects_are_never_in_the_orphan_list_a_sweep_acts_on():
    report = judge(seed_peer(), node="ai002", files=FILES)
    suspects = {s.proc.pid for s in report.suspects}
    assert suspects == {201, 301}
    assert suspects.isdisjoint(o.proc.pid for o in report.orphans)
    assert all(report.rule_of(pid) is None for pid in suspects)
    assert report.suspect_rule_of(201) is SuspectRule.DUPLICATE_RANK_UNDECIDED
    assert not set(SuspectRule.__members__.values()) & set(Rule.__members__.values())
