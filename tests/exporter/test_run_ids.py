"""The run-id convention: `<state_dir>/runs/<model>.current` and the rank environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_medic.state.runs import (
    current_run_path,
    new_run_id,
    read_current_run,
    record_current_run,
    run_env,
)


def test_the_current_run_round_trips_through_the_state_dir(tmp_path: Path):
    assert read_current_run(tmp_path, "glm-4_6-5b") is None
    path = record_current_run(tmp_path, "glm-4_6-5b", "run-1")
    assert path == tmp_path / "runs" / "glm-4_6-5b.current"
    record_current_run(tmp_path, "glm-4_6-5b", "run-2")
    assert read_current_run(tmp_path, "glm-4_6-5b") == "run-2"
    assert sorted(p.name for p in path.parent.iterdir()) == ["glm-4_6-5b.current"]  # no temp


def test_new_run_ids_are_valid_unique_and_sort_by_start_time():
    first, second = new_run_id(now=1_700_000_000), new_run_id(now=1_700_000_060)
    assert first.startswith("20231114T221320Z-")
    assert first < second
    assert new_run_id() != new_run_id()
    assert run_env("glm", first) == {"MLX_MEDIC_RUN_ID": first, "MLX_MEDIC_MODEL": "glm"}


def test_a_bad_run_id_or_model_name_is_refused_with_a_message_naming_it(tmp_path: Path):
    with pytest.raises(ValueError, match="run id 'a b'"):
        record_current_run(tmp_path, "glm", "a b")
    with pytest.raises(ValueError, match=r"model name '\.\./x'"):
        current_run_path(tmp_path, "../x")


def test_unreadable_or_planted_run_files_read_as_no_current_run(tmp_path: Path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "glm.current").write_bytes(b"\xff\xfe not text")
    assert read_current_run(tmp_path, "glm") is None
    target = tmp_path / "elsewhere"
    target.write_text("run-9\n")
    (runs / "qwq.current").symlink_to(target)
    assert read_current_run(tmp_path, "qwq") is None
    # A model discovered by its --model path cannot name a run file.
    assert read_current_run(tmp_path, "/srv/models/tiny") is None
