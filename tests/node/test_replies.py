"""The caller-side reply types read each helper's document by one rule: missing or
ill-typed fields read as unknown, and a process without a pid (or a backend reply without
a choice, a pid-alive reply without a liveness) is garbage, an error that names the
field; documents the helpers write read whole (mlx_medic.node.replies)."""

from __future__ import annotations

from typing import Any

import pytest

from mlx_medic.node.facts_reply import FactsReply
from mlx_medic.node.replies import (
    BackendReply,
    CleanReply,
    Fields,
    OrphansReply,
    PathEntry,
    PidAliveReply,
    ProcessEntry,
    ReplyError,
    ServiceReply,
)
from mlx_medic.node.sweep_reply import NO_LEDGER, SweepReply
from mlx_medic.processes.pid_liveness import Liveness
from mlx_medic.state.service_stop import ServiceStop


def read(kind: Any, document: dict[str, Any]) -> Any:
    return kind.parse("ai002", Fields(document))


def test_an_empty_document_reads_as_unknown_everywhere() -> None:
    assert read(SweepReply, {}) == SweepReply()
    assert read(SweepReply, {}).ledger == NO_LEDGER
    assert read(CleanReply, {}) == CleanReply()
    assert read(ServiceReply, {}) == ServiceReply()
    assert read(OrphansReply, {}) == OrphansReply()
    assert read(FactsReply, {}) == FactsReply("ai002")


def test_ill_typed_fields_read_as_unknown_not_as_a_failure() -> None:
    facts = read(
        FactsReply,
        {
            "memory": {"available_bytes": "lots"},
            "versions": ["mlx"],
            "rdma": {"ports": [{"device": "rdma_en2", "port": 1, "active": "yes"}, "junk"]},
            "log_sizes": {"/l/service.log": "big", "/l/err.log": 12},
            "serve": {"failed_starts": True, "failed_backends": "jaccl"},
        },
    )
    assert facts.memory_available is None and facts.mlx is None
    assert facts.rdma_ports == [("rdma_en2:1", None)]
    assert facts.log_sizes == {"/l/service.log": None, "/l/err.log": 12}
    assert facts.serve_failed_starts is None and facts.serve_failed_backends == ()
    service = read(
        ServiceReply,
        {"exit_status": None, "stopped_by": {"reason": "no run"}, "failed_starts": "4"},
    )
    assert service.exit_status is None and service.stopped_by is None
    assert service.failed_starts is None
    assert read(SweepReply, {"survivors": "none", "pd_spent": "2", "ledger": "x"}) == SweepReply()


def test_a_service_status_reads_its_stop_record_and_a_start_its_marks() -> None:
    service = read(
        ServiceReply,
        {
            "exit_status": 3,
            "stderr": "Boot-out failed",
            "stopped_by": {"run": "remediator run 12", "at": 5.5, "reason": "down"},
            "log_sizes": {"/l/service.log": 1000},
            "failed_starts": 4,
        },
    )
    assert service == ServiceReply(
        3,
        "",
        "Boot-out failed",
        ServiceStop("remediator run 12", 5.5, "down"),
        {"/l/service.log": 1000},
        4,
    )


def test_a_stop_reads_the_record_it_replaced() -> None:
    killed = {"run": "remediator run 3 (pid 99 on medic-b)", "at": 2.0, "reason": "down"}
    stop = read(ServiceReply, {"exit_status": 0, "replaced": killed})
    assert stop.replaced == ServiceStop("remediator run 3 (pid 99 on medic-b)", 2.0, "down")
    assert read(ServiceReply, {"exit_status": 0, "replaced": None}).replaced is None


def test_a_sweep_reads_its_processes_and_tells_killable_survivors_from_unkillable() -> None:
    frozen = {"pid": 7, "start_time": 2.0, "cmdline": ["python"], "role": "rank", "state": "U"}
    asleep = {"pid": 8, "start_time": 3.0, "role": "rank", "state": "S"}
    sweep = read(
        SweepReply,
        {
            "model": "glm",
            "survivors": [frozen, asleep],
            "unkillable": [{**frozen, "backend": "jaccl", "holds_port": True}],
            "not_ours": [{"pid": 9, "role": "rank", "owner": "root", "holds_port": True}],
            "complete": False,
            "pd_spent": 1,
        },
    )
    assert [s.identity for s in sweep.unkillable] == [("ai002", 7, 2.0)]
    assert sweep.unkillable[0].holds_port and sweep.unkillable[0].node == "ai002"
    assert sweep.killable == (ProcessEntry(8, 3.0, role="rank", state="S"),)
    assert sweep.not_ours == (ProcessEntry(9, role="rank", owner="root", holds_port=True),)
    assert not sweep.settled and sweep.pd_spent == 1  # no `settled`: `complete` says


def test_a_clean_reads_its_paths_and_owners() -> None:
    clean = read(
        CleanReply,
        {
            "removed": [{"path": "/tmp/tmp.a", "bytes": 3}],
            "bytes_freed": 3,
            "not_ours": [{"path": "/tmp/tmp.b", "owner": "root"}],
        },
    )
    assert clean == CleanReply((PathEntry("/tmp/tmp.a"),), 3, (PathEntry("/tmp/tmp.b", "root"),))


@pytest.mark.parametrize(
    ("kind", "document", "field"),
    [
        (SweepReply, {"unkillable": [{"pid": "4242"}]}, "unkillable[0].pid"),
        (SweepReply, {"survivors": [{"role": "rank"}]}, "survivors[0].pid"),
        (SweepReply, {"signalled": [{"pid": 1, "start_time": "now"}]}, "signalled[0].start_time"),
        (SweepReply, {"serving_listener": {"pid": None}}, "serving_listener.pid"),
        (SweepReply, {"unkillable": [{"pid": 1, "cmdline": 5}]}, "unkillable[0]"),
        (OrphansReply, {"orphans": [{"pid": True}]}, "orphans[0].pid"),
        (BackendReply, {"choice": "fast"}, "choice"),
        (BackendReply, {}, "choice"),
        (PidAliveReply, {"liveness": "maybe", "why": "?"}, "liveness"),
        (PidAliveReply, {"why": "no liveness"}, "liveness"),
    ],
)
def test_what_a_caller_acts_on_must_be_there(kind: Any, document: dict, field: str) -> None:
    with pytest.raises(ReplyError) as caught:
        read(kind, document)
    assert caught.value.field == field


def test_a_pid_alive_reads_the_liveness_the_helper_wrote() -> None:
    reply = read(PidAliveReply, {"liveness": "reused", "why": "started at another time"})
    assert reply == PidAliveReply(Liveness.REUSED, "started at another time")
