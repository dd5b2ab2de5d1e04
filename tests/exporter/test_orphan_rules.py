"""The orphan rules, on synthetic process tables shaped like the seed's cluster."""

from __future__ import annotations

from mlx_medic.processes.command_line import launched_command, ssh_destination
from mlx_medic.processes.info import ProcessInfo, Role, State, by_pid
from mlx_medic.processes.orphans import Rule, SuspectRule, find_orphans, scope
from mlx_medic.processes.placement import placement_of_env
from mlx_medic.processes.roles import classify_cmdline
from mlx_medic.processes.scope import ModelScoper
from tests.exporter.process_tables import (
    INVENTORY,
    MODEL_PATH,
    PYTHON,
    SSHD_LISTENER,
    SSHD_SESSION,
    launcher_argv,
    proc,
    rank_argv,
    ssh_client_argv,
    table,
)


def judge(
    processes: list[ProcessInfo],
    *,
    node: str | None,
    current=None,
    established=None,
    listening=None,
    files=None,
    inventory=INVENTORY,
):
    """The rules over a synthetic table; `listening`: pid -> ports, `files`: path -> text."""
    scoped = scope(processes, ModelScoper(inventory))
    ports = listening or {}
    return find_orphans(
        scoped,
        by_pid(processes),
        node=node,
        inventory=inventory,
        current_run=current or (lambda model: None),
        established=established or (lambda sshd: True),
        listening=lambda p, port: port in ports.get(p.pid, ()),
        placement_of=lambda p: placement_of_env(p.env, (files or {}).get),
    )


def orphan_rules(report) -> dict[int, Rule]:
    return {o.proc.pid: o.rule for o in report.orphans}


def suspect_rules(report) -> dict[int, SuspectRule]:
    return {s.proc.pid: s.rule for s in report.suspects}


def peer_with_two_runs(*, first_state: State = State.UNINTERRUPTIBLE) -> list[ProcessInfo]:
    """ai002 after the launcher died and the service started the model again."""
    return table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(100, 1, SSHD_LISTENER),
        proc(200, 100, SSHD_SESSION, name="sshd", state=State.UNINTERRUPTIBLE),
        proc(201, 200, rank_argv(), env={"MLX_RANK": "1"}, created=1000, state=first_state),
        proc(300, 100, SSHD_SESSION, name="sshd"),
        proc(301, 300, rank_argv(), env={"MLX_RANK": "1"}, created=2000),
    )


# --- classification ---------------------------------------------------------------


def test_an_mlx_lm_server_rank_is_recognised_by_its_module_not_a_substring():
    assert classify_cmdline(rank_argv()) is Role.RANK
    assert classify_cmdline([PYTHON, "-m", "mlx_lm", "server", "--port", "1"]) is Role.RANK
    assert classify_cmdline(["/opt/bin/mlx_lm.server", "--model", "x"]) is Role.RANK
    assert classify_cmdline(["grep", "mlx_lm.server"]) is None
    assert classify_cmdline([PYTHON, "-c", "print('-m mlx_lm.server')"]) is None
    assert classify_cmdline(["uvx", "--from", "mlx-lm", "mlx_lm.server"]) is None


def test_share_and_launcher_and_ssh_clients_have_their_own_roles():
    assert classify_cmdline([PYTHON, "-m", "mlx_lm", "share", "--model", "x"]) is Role.SHARE
    assert classify_cmdline([PYTHON, "-m", "mlx_lm.share"]) is Role.SHARE
    assert classify_cmdline(launcher_argv(rank_argv())) is Role.LAUNCHER
    assert classify_cmdline([PYTHON, "-m", "mlx._distributed_utils.launch"]) is Role.LAUNCHER
    client = ssh_client_argv("192.168.101.2", 1, rank_argv())
    assert classify_cmdline(client) is Role.SSH_CLIENT
    assert launched_command(client) == tuple(rank_argv())
    assert ssh_destination(client) == "192.168.101.2"
    assert classify_cmdline(["ssh", "-tt", "192.168.101.2", "uptime"]) is None


def test_any_command_started_with_mlx_rank_is_a_rank_like_the_seeds_serve_py():
    seed_rank = proc(5, 1, ["python3", "serve.py", "--model", MODEL_PATH], env={"MLX_RANK": "2"})
    assert seed_rank.role is Role.RANK
    assert proc(6, 1, ["python3", "serve.py", "--model", MODEL_PATH]).role is None


def test_exo_runners_are_spawn_children_of_exo():
    spawn = [
        PYTHON,
        "-c",
        "from multiprocessing.spawn import spawn_main; spawn_main()",
        "--multiprocessing-fork",
    ]
    processes = table(
        proc(10, 1, [PYTHON, "/opt/exo/bin/exo"]),
        proc(11, 10, spawn),
        proc(20, 1, [PYTHON, "-m", "some_other_app"]),
        proc(21, 20, spawn),
    )
    roles = {p.pid: p.role for p in processes}
    assert roles[11] is Role.EXO_RUNNER
    assert roles[21] is None


EXO_SPAWN = [
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
    "--multiprocessing-fork",
]


def test_an_exo_runner_whose_exo_was_killed_is_an_orphan_found_by_its_interpreter():
    exo_python = "/opt/exo/.venv/bin/python3"
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(30, 1, [exo_python, *EXO_SPAWN], name="python3"),  # adopted by launchd
        proc(40, 1, [PYTHON, *EXO_SPAWN]),  # some other app's orphaned worker
    )
    assert {p.pid: p.role for p in processes} == {1: None, 30: Role.EXO_RUNNER, 40: None}
    assert orphan_rules(judge(processes, node="ai001")) == {30: Rule.LAUNCHER_GONE}


def test_an_exo_runner_under_its_live_exo_is_not_an_orphan():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, ["/opt/exo/.venv/bin/python3", "-m", "exo.main"]),
        proc(11, 10, ["/opt/exo/.venv/bin/python3", *EXO_SPAWN]),
    )
    assert processes[2].role is Role.EXO_RUNNER
    assert ModelScoper(INVENTORY).model_of(processes[2]) == "exo"
    assert orphan_rules(judge(processes, node="ai001")) == {}


def test_scope_is_by_port_then_tmpdir_then_model_path_with_an_inventory():
    scoper = ModelScoper(INVENTORY)
    assert scoper.model_of(proc(1, 0, rank_argv(port=8081))) == "qwq"
    assert scoper.model_of(proc(1, 0, rank_argv(port=9999))) is None  # a manual test server
    share = proc(
        1, 0, [PYTHON, "-m", "mlx_lm", "share", "--tmpdir", "/Users/ai/.cache/mlx-share/glm/x"]
    )
    assert scoper.model_of(share) == "glm"
    assert (
        scoper.model_of(proc(1, 0, [PYTHON, "-m", "mlx_lm.server", "--model", MODEL_PATH])) == "glm"
    )
    client = proc(1, 0, ssh_client_argv("192.168.101.2", 1, rank_argv(port=8081)))
    assert scoper.model_of(client) == "qwq"


def test_without_inventory_ranks_are_grouped_by_their_model_argument():
    scoper = ModelScoper(None)
    assert scoper.model_of(proc(1, 0, rank_argv(model="/srv/m1"))) == "/srv/m1"
    assert scoper.model_of(proc(1, 0, [PYTHON, "-m", "mlx_lm.server"])) == "unknown"


# --- the rules ---------------------------------------------------------------------


def test_two_peer_ranks_whose_sessions_both_hold_a_client_are_suspects_never_a_guess_by_age():
    """More ranks than the model runs here, and nothing on the peer tells which is
    current: the dead launch's ssh client still lives on the launching node."""
    processes = peer_with_two_runs()
    report = judge(processes, node="ai002")
    assert orphan_rules(report) == {}
    assert suspect_rules(report) == {
        201: SuspectRule.EXCESS_RANKS_UNDECIDED,
        301: SuspectRule.EXCESS_RANKS_UNDECIDED,
    }


def test_a_ppid_1_sweep_finds_nothing_on_that_peer():
    processes = peer_with_two_runs()
    ranks = [p for p in processes if p.role is Role.RANK]
    assert [p.pid for p in ranks if p.ppid == 1] == []


def test_the_live_rank_is_kept_even_when_a_zombie_rank_is_newer():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), created=100),
        proc(11, 1, rank_argv(), created=200, state=State.ZOMBIE),
    )
    assert orphan_rules(judge(processes, node="ai002")) == {11: Rule.EXCESS_RANKS}


def test_ranks_of_a_model_on_a_node_it_does_not_use_are_all_excess():
    processes = table(proc(1, 0, ["/sbin/launchd"]), proc(10, 1, rank_argv(), created=5))
    assert orphan_rules(judge(processes, node="ai003")) == {10: Rule.EXCESS_RANKS}


def test_a_rank_whose_run_id_is_not_current_is_stale_whoever_its_parent_is():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env={"MLX_RANK": "0", "MLX_MEDIC_RUN_ID": "run-a"}),
        proc(11, 1, rank_argv(), env={"MLX_RANK": "0", "MLX_MEDIC_RUN_ID": "run-b"}),
    )
    # Both have ppid 1 and MLX_RANK: the launcher rule would call both orphans;
    # the run id decides first.
    report = judge(processes, node="ai002", current=lambda model: "run-b")
    assert orphan_rules(report)[10] is Rule.STALE_RUN_ID
    assert orphan_rules(report).get(11) is not Rule.STALE_RUN_ID


def test_no_recorded_current_run_means_no_stale_run_verdict():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(5, 1, launcher_argv(rank_argv())),
        proc(10, 5, rank_argv(), env={"MLX_RANK": "0", "MLX_MEDIC_RUN_ID": "run-a"}),
    )
    assert orphan_rules(judge(processes, node="ai001")) == {}


def test_an_ssh_client_carries_its_run_id_in_the_launch_script():
    client = ssh_client_argv("192.168.101.2", 1, rank_argv(), env={"MLX_MEDIC_RUN_ID": "old"})
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(5, 1, launcher_argv(rank_argv())),
        proc(6, 5, client),
    )
    report = judge(processes, node="ai001", current=lambda model: "new")
    assert orphan_rules(report) == {6: Rule.STALE_RUN_ID}


def test_after_the_launcher_dies_its_local_rank_and_ssh_clients_are_orphans():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(10, 1, rank_argv(), env={"MLX_RANK": "0"}),
        proc(11, 1, ssh_client_argv("192.168.101.2", 1, rank_argv())),
    )
    report = judge(processes, node="ai001")
    assert orphan_rules(report) == {10: Rule.LAUNCHER_GONE, 11: Rule.LAUNCHER_GONE}
    assert report.suspected_remote == {("glm", "ai002"): 1}


def test_while_the_launcher_lives_nothing_is_an_orphan():
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(5, 1, launcher_argv(rank_argv())),
        proc(6, 5, ["/bin/bash", "-c", "..."]),
        proc(10, 6, rank_argv(), env={"MLX_RANK": "0"}),
        proc(11, 5, ssh_client_argv("192.168.101.2", 1, rank_argv())),
    )
    report = judge(processes, node="ai001")
    assert report.orphans == []
    assert not report.suspected_remote


def test_ranks_under_a_live_mlx_lm_share_are_not_orphans_of_a_missing_launcher():
    share = [PYTHON, "-m", "mlx_lm", "share", "--tmpdir", "/Users/ai/.cache/mlx-share/glm/t"]
    processes = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(5, 1, share),
        proc(6, 5, share, env={"MLX_RANK": "0"}),
    )
    assert orphan_rules(judge(processes, node="ai001")) == {}
    del processes[1]  # the share parent dies: its rank is left behind
    assert orphan_rules(judge(processes, node="ai001")) == {6: Rule.LAUNCHER_GONE}


def test_a_service_rank_without_mlx_rank_is_not_judged_by_the_launcher_rule():
    processes = table(proc(1, 0, ["/sbin/launchd"]), proc(10, 1, rank_argv()))
    assert orphan_rules(judge(processes, node="ai001")) == {}


def test_a_peer_rank_whose_sshd_lost_its_client_is_an_orphan():
    processes = peer_with_two_runs()
    live_sessions = {300}  # the listener (100) holds no ESTABLISHED connection, only LISTEN
    report = judge(processes, node="ai002", established=lambda sshd: sshd.pid in live_sessions)
    assert orphan_rules(report) == {201: Rule.SSH_CLIENT_LOST}


def test_a_rank_adopted_by_the_listening_sshd_is_judged_by_its_missing_launcher():
    processes = table(
        proc(1, 0, SSHD_LISTENER, name="sshd"),  # sshd is pid 1 in a testbed node
        proc(10, 1, rank_argv(), env={"MLX_RANK": "0"}),
    )
    report = judge(processes, node="ai001", established=lambda sshd: False)
    assert orphan_rules(report) == {10: Rule.LAUNCHER_GONE}


def test_when_connections_cannot_be_read_the_ssh_rule_stays_silent():
    processes = peer_with_two_runs()
    report = judge(processes, node="ai002", established=lambda sshd: None)
    assert orphan_rules(report) == {}
    assert set(suspect_rules(report)) == {201, 301}  # excess, but which is current is unknown


def test_each_orphan_carries_exactly_one_rule():
    processes = peer_with_two_runs()
    report = judge(processes, node="ai002", established=lambda sshd: sshd.pid == 300)
    assert [(o.proc.pid, o.rule) for o in report.orphans] == [(201, Rule.SSH_CLIENT_LOST)]
