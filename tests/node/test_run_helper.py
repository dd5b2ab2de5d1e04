"""`mlx-medic node run`: the model's current run and its lease on this node; renew and
clear act only for the current run; clear keeps the current run readable."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mlx_medic.state.runs import read_current_run, read_lease
from tests.node.helper_runner import Helpers, two_model_helpers


@pytest.fixture
def helpers(tmp_path: Path) -> Helpers:
    return two_model_helpers(tmp_path)


def test_show_is_null_until_a_run_is_set(helpers: Helpers) -> None:
    document = helpers.document("run", "m1", "show")
    assert (document["current"], document["lease"]) == (None, None)


def test_set_records_the_current_run_and_its_lease_when_given(helpers: Helpers) -> None:
    before = time.time()
    document = helpers.document("run", "m1", "set", "r-1", "--lease", "30", "--holder", "serve 1")
    assert document["current"] == "r-1" and document["lease"]["run_id"] == "r-1"
    assert document["lease"]["holder"] == "serve 1"
    assert before + 30 <= document["lease"]["expires_at"] <= time.time() + 30
    assert read_current_run(helpers.state, "m1") == "r-1"
    plain = helpers.document("run", "m1", "set", "r-2")
    assert plain["current"] == "r-2" and plain["lease"]["run_id"] == "r-1"  # lease untouched


def test_renew_extends_the_lease_of_the_current_run(helpers: Helpers) -> None:
    helpers.document("run", "m1", "set", "r-1", "--lease", "5", "--holder", "serve 1")
    renewed = helpers.document("run", "m1", "renew", "r-1", "--lease", "600", "--holder", "s 2")
    assert renewed["changed"] and renewed["lease"]["expires_at"] > time.time() + 500
    assert renewed["lease"]["holder"] == "s 2"


def test_renew_for_another_run_exits_1_and_changes_nothing(helpers: Helpers) -> None:
    helpers.document("run", "m1", "set", "r-2", "--lease", "60", "--holder", "new")
    lease = read_lease(helpers.state, "m1")
    document = helpers.document(
        "run", "m1", "renew", "r-1", "--lease", "600", "--holder", "old", status=1
    )
    assert not document["changed"] and "run r-1 is not current here (r-2)" in document["refused"]
    assert read_lease(helpers.state, "m1") == lease
    assert read_current_run(helpers.state, "m1") == "r-2"


def test_clear_ends_the_lease_but_keeps_the_current_run_readable(helpers: Helpers) -> None:
    helpers.document("run", "m1", "set", "r-1", "--lease", "60", "--holder", "serve")
    other = helpers.document("run", "m1", "clear", "r-0", status=1)
    assert other["lease"] is not None and not other["changed"]
    cleared = helpers.document("run", "m1", "clear", "r-1")
    assert cleared["changed"] and cleared["lease"] is None and cleared["current"] == "r-1"
    assert read_current_run(helpers.state, "m1") == "r-1"  # stale_run_id still has its reference


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("m9", "show"), "model 'm9' is not in the inventory"),
        (("m2", "show"), "'m2' is not placed on node n1"),
        (("m1", "set", "bad id!"), "run id 'bad id!' must be"),
        (("m1", "set", "r-1", "--lease", "30"), "--lease and --holder go together"),
        (("m1", "set", "r-1", "--lease", "-1", "--holder", "x"), "a lease is a positive number"),
        (("m1", "renew", "r-1"), "required"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(
    helpers: Helpers, args: tuple[str, ...], why: str
) -> None:
    result = helpers.run("run", *args)
    assert result.returncode == 2 and why in result.stderr
