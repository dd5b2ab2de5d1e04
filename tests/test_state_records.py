"""A node's records about a model: whole or absent, never read through a planted link;
the backend choice defaults to auto; a service stop names its run until cleared; a run's
lease runs out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlx_medic.state.backend_choice import (
    backend_choice_path,
    read_backend_choice,
    write_backend_choice,
)
from mlx_medic.state.files import StateFileError, read_json_record, write_json_record
from mlx_medic.state.node_drain import clear_node_drain, read_node_drain, record_node_drain
from mlx_medic.state.runs import lease_path, read_lease, record_lease
from mlx_medic.state.service_stop import clear_service_stop, read_service_stop, record_service_stop


def test_no_backend_record_means_auto(tmp_path: Path) -> None:
    choice = read_backend_choice(tmp_path, "m1")
    assert choice.choice == "auto" and not choice.pinned


def test_a_pin_is_durable_and_says_who_and_why(tmp_path: Path) -> None:
    write_backend_choice(
        tmp_path, "m1", "ring", by="remediator run 7", reason="jaccl failed", now=100.0
    )
    choice = read_backend_choice(tmp_path, "m1")
    assert (choice.choice, choice.by, choice.at, choice.reason, choice.pinned) == (
        "ring",
        "remediator run 7",
        100.0,
        "jaccl failed",
        True,
    )
    write_backend_choice(tmp_path, "m1", "auto", by="root", reason="rebooted")
    assert not read_backend_choice(tmp_path, "m1").pinned


def test_an_unknown_backend_choice_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'tcp' is not a backend choice"):
        write_backend_choice(tmp_path, "m1", "tcp", by="x", reason="")
    with pytest.raises(ValueError, match="not a valid inventory model name"):
        backend_choice_path(tmp_path, "../etc")


def test_a_record_behind_a_symlink_is_never_read(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('{"choice": "ring"}')
    path = backend_choice_path(tmp_path, "m1")
    path.parent.mkdir(parents=True)
    os.symlink(target, path)
    with pytest.raises(StateFileError, match="symlink"):
        read_backend_choice(tmp_path, "m1")


def test_a_damaged_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("[1, 2")
    with pytest.raises(StateFileError, match=str(path)):
        read_json_record(path)


def test_a_write_replaces_the_record_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_record(path, {"a": 1})
    write_json_record(path, {"b": 2})
    assert read_json_record(path) == {"b": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left


def test_a_service_stop_names_its_run_until_cleared(tmp_path: Path) -> None:
    assert read_service_stop(tmp_path, "m1") is None
    record_service_stop(tmp_path, "m1", "remediator run 12", "recover", now=5.0)
    stop = read_service_stop(tmp_path, "m1")
    assert stop is not None
    assert (stop.run, stop.at, stop.reason) == ("remediator run 12", 5.0, "recover")
    assert clear_service_stop(tmp_path, "m1") is True
    assert read_service_stop(tmp_path, "m1") is None
    assert clear_service_stop(tmp_path, "m1") is False


def test_a_lease_runs_out_at_its_time(tmp_path: Path) -> None:
    lease = record_lease(tmp_path, "m1", "run-1", 15, "serve pid 1", now=100.0)
    assert read_lease(tmp_path, "m1") == lease
    assert not lease.expired(114.9) and lease.expired(115.0)
    with pytest.raises(ValueError, match="already run out"):
        record_lease(tmp_path, "m1", "run-1", 0, "x")


def test_an_unreadable_lease_is_an_error_not_a_live_lease(tmp_path: Path) -> None:
    path = lease_path(tmp_path, "m1")
    path.parent.mkdir(parents=True)
    path.write_text('{"run_id": "run-1"}')
    with pytest.raises(StateFileError, match="not a run lease"):
        read_lease(tmp_path, "m1")


def test_a_node_drain_names_who_and_its_models_until_cleared(tmp_path: Path) -> None:
    assert read_node_drain(tmp_path) is None
    record_node_drain(tmp_path, "alice@host", ("m1", "m2"), now=5.0)
    drained = read_node_drain(tmp_path)
    assert drained is not None and (drained.by, drained.since, drained.models) == (
        "alice@host",
        5.0,
        ("m1", "m2"),
    )
    assert clear_node_drain(tmp_path) is True
    assert read_node_drain(tmp_path) is None and clear_node_drain(tmp_path) is False
    with pytest.raises(ValueError):
        record_node_drain(tmp_path, "alice@host", ("../m",))
