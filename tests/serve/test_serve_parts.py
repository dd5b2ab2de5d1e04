"""The wrapper's decisions, each on its own: the smoke test's verdict, the backends to
try, the ledger's veto, when the smoke test may be skipped, the sweep's verdict, the
refusal of a second wrapper, and the mlx.launch command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_medic.model_lock import process_start_time
from mlx_medic.node.client import HelperCallError, HelperReply, read_as
from mlx_medic.node.replies import ProcessEntry
from mlx_medic.node.sweep_reply import SweepReply
from mlx_medic.serve.backend import candidates, ledger_refusal, smoke_can_be_skipped
from mlx_medic.serve.cli import wrapper_ssh
from mlx_medic.serve.launch import (
    launch_argv,
    serve_args_warnings,
    server_command,
    smoke_command,
)
from mlx_medic.serve.nodes import judge_sweep
from mlx_medic.serve.record import (
    Failure,
    JacclSuccess,
    ServeRecord,
    read_serve_record,
    wrapper_alive,
    write_serve_record,
)
from mlx_medic.serve.smoke import judge
from mlx_medic.serve.start import AlreadyServed, busy_message, refuse_if_live
from mlx_medic.state.backend_choice import AUTO, BackendChoice
from tests.serve.inventories import BOTH, inventory, jaccl_inventory

NODES = ["ai001", "ai002"]


# --- the smoke test's verdict -------------------------------------------------------


def test_every_rank_with_the_full_sum_is_a_passed_smoke_test():
    out = "mlx-medic smoke: rank 1 of 2 ok sum=2\nmlx-medic smoke: rank 0 of 2 ok sum=2\n"
    assert judge(out, NODES, timed_out=False, limit=60).ok


def test_a_rank_that_says_why_it_failed_names_its_node_and_the_reason():
    out = (
        "mlx-medic smoke: rank 1 failed: RuntimeError: Cannot initialize jaccl distributed"
        " backend.\n\x1b[33m[WARN] Node with rank 1 exited with code 1 \x1b[0m\n"
        "[WARN] Node with rank 0 exited with code -15\n"
    )
    verdict = judge(out, NODES, timed_out=False, limit=60)
    assert (verdict.ok, verdict.host) == (False, "ai002")
    assert verdict.reason == "RuntimeError: Cannot initialize jaccl distributed backend."


def test_mlx_launch_exiting_0_without_the_sums_is_a_failure_whatever_its_status():
    out = "[WARN] Node with rank 0 exited with code 1\n"
    verdict = judge(out, NODES, timed_out=False, limit=60)
    assert (verdict.ok, verdict.host) == (False, "ai001")


def test_mlx_launch_refusing_a_broken_hostfile_is_a_failure_on_the_head():
    out = "usage: mlx.launch [-h] ...\nmlx.launch: error: The hostfile is malformed\n"
    verdict = judge(out, NODES, timed_out=False, limit=60)
    assert verdict.host == "ai001" and "The hostfile is malformed" in verdict.reason


def test_a_timed_out_smoke_test_names_the_ranks_that_said_nothing():
    out = "mlx-medic smoke: rank 0 of 2 ok sum=2\n"
    verdict = judge(out, NODES, timed_out=True, limit=30)
    assert (verdict.ok, verdict.host) == (False, "ai002")
    assert "no all-reduce within 30s" in verdict.reason


# --- which backends, and the ledger's veto --------------------------------------------


def test_auto_tries_jaccl_then_ring_and_a_pin_tries_only_the_pinned_one(tmp_path: Path):
    model = inventory(tmp_path, BOTH).model("tiny")
    assert [c.name for c in candidates(model, AUTO)[0]] == ["jaccl", "ring"]
    ring = BackendChoice("ring", "remediator run 3", 1.0, "JACCL failed twice")
    assert [c.name for c in candidates(model, ring)[0]] == ["ring"]


def test_a_pin_to_a_backend_the_model_lacks_is_a_failure_that_says_so(tmp_path: Path):
    model = inventory(tmp_path, "{ring: {hostfile: /etc/ring.json}}").model("tiny")
    found, refused = candidates(model, BackendChoice("jaccl", "root", 1.0, "testing"))
    assert found == [] and "pinned to jaccl" in refused[0].reason


def reply(node: str, ledger: dict) -> dict:
    """A node's ledger as its start sweep reports it (`debt_by_unit`, `boot_id`)."""
    return {"boot_id": f"boot-{node}", "debt_by_unit": {}, **ledger}


def test_jaccl_is_judged_per_device_each_node_needs_and_a_refusal_names_every_model_there(
    tmp_path: Path,
):
    inv = jaccl_inventory(tmp_path)
    model = inv.model("tiny")
    # ai002's own device rdma_en5 has room; another device of the node is full: no veto.
    room = {"debt_by_unit": {"rdma_en5": 2, "rdma_en9": 7}}
    full = {"debt_by_unit": {"rdma_en5": 3}}
    unknown = {"debt_by_unit": {"node": 2, "rdma_en5": 1}}  # unknown devices count on each
    assert (
        ledger_refusal(model, {"ai001": reply("ai001", {}), "ai002": reply("ai002", room)}, inv)
        is None
    )
    for ledger in (full, unknown):
        refusal = ledger_refusal(
            model, {"ai001": reply("ai001", {}), "ai002": reply("ai002", ledger)}, inv
        )
        assert refusal is not None and refusal.host == "ai002"
        assert "at the reserve on rdma_en5: 3 spent (reserve 3 per device" in refusal.reason
        assert "models placed on ai002: tiny, other" in refusal.reason


def test_without_a_readable_hostfile_each_nodes_busiest_device_is_judged(tmp_path: Path):
    model = inventory(tmp_path, BOTH).model("tiny")  # /etc/jaccl.json does not exist here
    busy = {"debt_by_unit": {"rdma_en9": 5, "rdma_en5": 0}}
    refusal = ledger_refusal(model, {"ai001": reply("ai001", {}), "ai002": reply("ai002", busy)})
    assert refusal is not None and refusal.host == "ai002" and "rdma_en9: 5 spent" in refusal.reason


def test_a_ledger_that_cannot_be_read_vetoes_jaccl(tmp_path: Path):
    model = inventory(tmp_path, BOTH).model("tiny")
    refusal = ledger_refusal(
        model, {"ai001": reply("ai001", {}), "ai002": {"error": "pd-ledger.json is not a ledger"}}
    )
    assert refusal is not None and refusal.host == "ai002"
    assert "its ledger cannot be read (pd-ledger.json is not a ledger)" in refusal.reason
    assert ledger_refusal(model, {"ai001": reply("ai001", {})}) is not None  # no answer


@pytest.mark.parametrize("backend", ["jaccl", "ring"])
def test_a_smoke_test_is_skipped_only_after_a_success_this_boot_and_no_error_since(backend):
    boots = {"ai001": "b1", "ai002": "b1"}
    record = ServeRecord(
        "r1",
        1,
        None,
        "starting",
        **{f"last_{backend}_success": JacclSuccess(dict(boots), at=100.0)},
    )
    assert smoke_can_be_skipped(record, boots, NODES, backend)
    other = "ring" if backend == "jaccl" else "jaccl"
    assert not smoke_can_be_skipped(record, boots, NODES, other)  # each backend its own
    assert not smoke_can_be_skipped(record, {**boots, "ai002": "b2"}, NODES, backend)  # rebooted
    errored = record.with_state("starting", **{f"{backend}_error_at": 150.0})
    assert not smoke_can_be_skipped(errored, boots, NODES, backend)
    assert not smoke_can_be_skipped(ServeRecord("r1", 1, None, "starting"), boots, NODES)


# --- the sweep's verdict ----------------------------------------------------------------


def sweep_reply(node: str, document: dict, status: int = 0) -> HelperReply[SweepReply]:
    base = {
        "signalled": [],
        "exited": [],
        "survivors": [],
        "unkillable": [],
        "spared": [],
        "pd_spent": 0,
        "complete": status == 0,
    }
    raw = HelperReply(
        node, "sweep", [], status, {"schema": 1, "command": "sweep", **base, **document}, None
    )
    return read_as(raw, SweepReply)


def test_an_unreachable_node_makes_the_sweep_incomplete_and_is_named():
    outcome = judge_sweep(
        "tiny",
        {
            "ai001": sweep_reply("ai001", {}),
            "ai002": HelperCallError("ai002", "sweep", "connection refused", unreachable=True),
        },
    )
    assert not outcome.complete
    assert outcome.problems[0].startswith("ai002: unreachable")


FROZEN = {
    "pid": 4242,
    "start_time": 1.0,
    "cmdline": ["python", "-m", "mlx_lm", "server"],
    "role": "rank",
    "state": "uninterruptible",
    "backend": "jaccl",
    "devices": ["rdma_en5"],
    "holds_port": False,
}


def test_an_unkillable_survivor_is_named_with_what_frees_it_and_the_start_goes_on():
    outcome = judge_sweep(
        "tiny",
        {
            "ai002": sweep_reply(
                "ai002", {"survivors": [FROZEN], "unkillable": [FROZEN], "settled": True}
            )
        },
    )
    assert outcome.complete and not outcome.blocked and outcome.problems == []
    assert outcome.survivors is not None
    assert outcome.survivors.describe() == (
        "ai002: pid 4242 (rank, state uninterruptible, holding 1 protection domain(s) on"
        " rdma_en5) survives SIGKILL: python -m mlx_lm server. reboot ai002 to free 1"
        " protection domain(s)"
    )


def test_a_survivor_on_the_models_port_blocks_the_start_with_the_reboot_it_needs():
    on_port = {**FROZEN, "holds_port": True}
    outcome = judge_sweep(
        "tiny",
        {
            "ai001": sweep_reply(
                "ai001",
                {"survivors": [on_port], "unkillable": [on_port], "settled": False},
                status=1,
            )
        },
    )
    assert outcome.blocked and outcome.survivors is not None
    assert outcome.survivors.reboot_nodes == ["ai001"]
    assert "holds model tiny's port" in outcome.survivors.refusal()
    assert "Reboot ai001" in outcome.survivors.refusal()


def test_a_killable_survivor_leaves_the_sweep_incomplete():
    stuck = {**FROZEN, "state": "sleeping"}
    outcome = judge_sweep(
        "tiny", {"ai002": sweep_reply("ai002", {"survivors": [stuck], "settled": False}, status=1)}
    )
    assert not outcome.complete
    assert outcome.problems == [
        "ai002: 1 process(es) survived the sweep and are not in uninterruptible sleep"
    ]


def test_an_answering_listener_found_by_the_start_sweep_is_reported():
    listener = {"pid": 77, "cmdline": ["python", "-m", "mlx_lm", "server"]}
    outcome = judge_sweep("tiny", {"ai001": sweep_reply("ai001", {"serving_listener": listener})})
    assert outcome.serving == {
        "ai001": ProcessEntry(77, cmdline=("python", "-m", "mlx_lm", "server"))
    }


# --- the head's serve record and a second wrapper ----------------------------------


def test_the_serve_record_round_trips(tmp_path: Path):
    record = ServeRecord(
        "r1",
        42,
        1000.5,
        "failed",
        backend="ring",
        failures=(Failure("jaccl", "ai002", "no RDMA", "line"),),
        failed_starts=3,
        last_jaccl_success=JacclSuccess({"ai001": "b"}, 9.0),
        jaccl_error_at=10.0,
    )
    write_serve_record(tmp_path, "tiny", record)
    assert read_serve_record(tmp_path, "tiny") == record


def test_a_live_wrapper_is_this_pid_started_then_and_a_reused_pid_is_not():
    me = ServeRecord("r1", os.getpid(), process_start_time(os.getpid()), "serving")
    assert wrapper_alive(me)
    assert not wrapper_alive(ServeRecord("r1", os.getpid(), 1.0, "serving"))  # reused pid
    assert not wrapper_alive(me.with_state("stopped"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not wrapper_alive(ServeRecord("r1", dead.pid, time.time(), "starting"))


def test_a_second_wrapper_is_refused_with_how_to_restart_the_service(tmp_path: Path):
    model = inventory(tmp_path, BOTH).model("tiny")
    live = ServeRecord("r1", os.getpid(), process_start_time(os.getpid()), "serving")
    with pytest.raises(AlreadyServed) as refused:
        refuse_if_live(model, live)
    assert f"wrapper pid {os.getpid()} (serving, run r1) lives" in str(refused.value)
    assert "supervisorctl -c /etc/supervisord.conf restart tiny-svc" in busy_message(model, "x")


# --- the mlx.launch command line -----------------------------------------------------


def test_the_launch_guards_mlx_launch_and_every_rank_and_tags_the_run(tmp_path: Path):
    inv = inventory(
        tmp_path,
        BOTH,
        serve="{python: /opt/mlx/bin/python, starting_port: 41000}",
        serve_args="{prefill-step-size: 2048}",
    )
    model = inv.model("tiny")
    ring = dict(model.backends.in_order())["ring"]
    argv = launch_argv(inv, model, "ring", ring, "run-1", server_command(model, ring))
    cut = argv.index("--")
    assert argv[1:3] == ["-m", "mlx_medic.serve.guard"]  # mlx.launch itself is guarded
    assert argv[argv.index("--backend") + 1] == "none"  # and no rank: no ledger spend
    launcher = argv[cut + 1 :]
    assert launcher[0].endswith("mlx.launch")
    inner = launcher.index("--")
    options = launcher[1:inner]
    assert options[options.index("--python") + 1] == "/opt/mlx/bin/python"
    assert options[options.index("--starting-port") + 1] == "41000"
    assert options[options.index("--backend") + 1] == "ring"
    assert "MLX_MEDIC_RUN_ID=run-1" in options and "MLX_MEDIC_MODEL=tiny" in options
    rank = launcher[inner + 1 :]
    assert rank[:2] == ["-m", "mlx_medic.serve.guard"] and "--python-args" in rank
    assert rank[rank.index("--backend") + 1] == "ring"
    assert rank[rank.index("--") + 1 :] == [
        "-m",
        "mlx_lm",
        "server",
        "--model",
        "/models/tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--pipeline",
        "--prefill-step-size",
        "2048",
    ]


def test_the_smoke_test_runs_the_smoke_rank_with_the_backend_and_the_state_dir(tmp_path: Path):
    inv = inventory(tmp_path, BOTH)
    assert smoke_command(inv.model("tiny"), "jaccl", inv) == [
        "-m",
        "mlx_medic.serve.smoke",
        "--backend",
        "jaccl",
        "--state-dir",
        str(tmp_path / "state"),
        "--model",
        "tiny",
    ]


def test_a_model_without_prefill_step_size_is_warned_about(tmp_path: Path):
    bare = inventory(tmp_path, BOTH).model("tiny")
    assert serve_args_warnings(bare) == [
        "model tiny has no prefill-step-size in serve_args: mlx_lm.server then prefills with"
        " its own default step, whatever the model's memory allows"
    ]
    set_ = inventory(tmp_path, BOTH, serve_args="{prefill-step-size: 2048}").model("tiny")
    assert serve_args_warnings(set_) == []


def test_the_wrapper_reaches_peers_with_its_own_key_never_the_remediators(tmp_path: Path):
    text = inventory(tmp_path, BOTH, serve="{identity_file: /home/mlx/.ssh/id_serve}")
    remediators = text.model_copy(
        update={
            "ssh": text.ssh.model_copy(
                update={"identity_file": Path("/etc/mlx-medic/remediator_key")}
            )
        }
    )
    model = remediators.model("tiny")
    assert wrapper_ssh(remediators, model).ssh.identity_file == Path("/home/mlx/.ssh/id_serve")
    default = inventory(tmp_path, BOTH).model("tiny")
    assert wrapper_ssh(remediators, default).ssh.identity_file is None  # the user's own keys
    assert wrapper_ssh(remediators, model).ssh.known_hosts == remediators.ssh.known_hosts


@pytest.mark.parametrize("form", ["list", "distributed_config"])
def test_each_nodes_devices_come_from_its_row_of_either_hostfile_form(tmp_path: Path, form: str):
    """A bare list of hosts, or the object `mlx.distributed_config` writes: mlx.launch reads
    both, and so does the per-device judgement."""
    from mlx_medic.serve.backend import jaccl_devices

    hosts = [
        {"ssh": "ai001", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en3"]},
        {"ssh": "ai002", "ips": ["10.0.0.2"], "rdma": ["rdma_en5", None]},
    ]
    inv = jaccl_inventory(tmp_path)
    data = hosts if form == "list" else {"backend": "jaccl", "envs": [], "hosts": hosts}
    Path(str(inv.model("tiny").backends.jaccl.hostfile)).write_text(json.dumps(data))
    assert jaccl_devices(inv.model("tiny")) == {"ai001": ("rdma_en3",), "ai002": ("rdma_en5",)}
