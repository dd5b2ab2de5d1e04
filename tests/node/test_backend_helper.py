"""`mlx-medic node backend`: the model's backend choice on its head, auto until someone
pins ring or jaccl, with who and why."""

from __future__ import annotations

from pathlib import Path

from mlx_medic.state.backend_choice import read_backend_choice
from tests.node.helper_runner import two_model_helpers


def test_show_is_auto_until_a_choice_is_recorded(tmp_path: Path) -> None:
    helpers = two_model_helpers(tmp_path)
    document = helpers.document("backend", "m1", "show")
    assert (document["choice"], document["pinned"], document["by"]) == ("auto", False, "")


def test_set_pins_with_who_and_why_and_auto_unpins(tmp_path: Path) -> None:
    helpers = two_model_helpers(tmp_path)
    pinned = helpers.document(
        "backend",
        "m1",
        "set",
        "ring",
        "--by",
        "remediator run 12",
        "--reason",
        "JACCL failed to start",
    )
    assert (pinned["choice"], pinned["pinned"], pinned["by"]) == ("ring", True, "remediator run 12")
    assert pinned["reason"] == "JACCL failed to start" and pinned["at"] > 0
    assert read_backend_choice(helpers.state, "m1").choice == "ring"
    assert helpers.document("backend", "m1", "show")["choice"] == "ring"
    unpinned = helpers.document("backend", "m1", "set", "auto", "--by", "ops", "--reason", "fixed")
    assert (unpinned["choice"], unpinned["pinned"]) == ("auto", False)


def test_only_on_the_head_and_only_known_choices(tmp_path: Path) -> None:
    helpers = two_model_helpers(tmp_path)
    peer = helpers.run("backend", "m1", "show", node="n2")
    assert peer.returncode == 2 and "its head n1, not on n2" in peer.stderr
    bad = helpers.run("backend", "m1", "set", "tcp", "--by", "x", "--reason", "y")
    assert bad.returncode == 2 and "invalid choice: 'tcp'" in bad.stderr
    unsaid = helpers.run("backend", "m1", "set", "ring")
    assert unsaid.returncode == 2 and "--by" in unsaid.stderr
