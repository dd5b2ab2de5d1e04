"""docs/install.md followed on a fresh three-user testbed (testbed/install_guide.py): its
commands read from the guide's text, each run where the guide says (this machine as the
remediator's host, or inside the nodes), run translated, or not run on Linux with the
reason. Every line of the guide has an outcome; every command that ran exited as the
guide says (doctor, check-config, remediate --dry-run: 0); the test alert fired through a
real Alertmanager ends as a dry-run plan; nothing lands in this machine's /etc."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.install_guide import (
    GUIDE,
    NOT_RUN,
    RAN,
    TRANSLATED,
    Outcome,
    Walk,
    guide_lines,
    report,
    walk_guide,
)
from tests.tools import require_root, require_tool

pytestmark = [pytest.mark.testbed]

TOOLS = ("sshd", "ssh", "ssh-keyscan", "unshare", "nsenter", "sudo", "visudo", "setpriv")
TOOLS += ("promtool", "amtool", "prometheus-alertmanager", "openssl", "curl")


@pytest.fixture(scope="module")
def walked(testbed_workdir: Path) -> Iterator[Walk]:
    require_root()
    for tool in TOOLS:
        require_tool(tool)
    walk = walk_guide(testbed_workdir / f"guide-{uuid.uuid4().hex[:6]}")
    print(report(walk))
    yield walk


def outcomes_of(walk: Walk, pattern: str) -> list[Outcome]:
    found = [o for o in walk.outcomes if re.search(pattern, o.line.text)]
    assert found, f"no outcome for a guide line matching {pattern!r}"
    return found


def test_every_line_of_the_guide_has_an_outcome(walked: Walk):
    lines = guide_lines(GUIDE.read_text())
    assert len(lines) >= 80
    walked_lines = {outcome.line for outcome in walked.outcomes}
    assert walked_lines == set(lines)
    assert {o.kind for o in walked.outcomes} == {RAN, TRANSLATED, NOT_RUN}


def test_every_command_that_ran_exited_as_the_guide_says(walked: Walk):
    wrong = [o.report() for o in walked.outcomes if not o.as_guide_says]
    assert not wrong, "\n".join(wrong)
    ran = [o for o in walked.outcomes if o.kind != NOT_RUN]
    assert all(o.exit is not None and o.command for o in ran)


def test_a_line_not_run_names_why_and_a_translation_says_what_ran_instead(walked: Walk):
    for outcome in walked.outcomes:
        if outcome.kind == NOT_RUN:
            assert outcome.why and not outcome.command
        if outcome.kind == TRANSLATED:
            assert outcome.why and outcome.command != outcome.line.text


def test_the_node_checks_run_on_every_node_as_root_and_pass(walked: Walk):
    nodes = {node.name for node in walked.cluster.nodes}
    for pattern in (r"mlx-medic doctor --inventory", r"mlx_medic_collector_success$"):
        for outcome in outcomes_of(walked, pattern):
            assert outcome.exit == 0, outcome.report()
        assert {o.where for o in outcomes_of(walked, pattern)} == nodes
    doctor = outcomes_of(walked, r"mlx-medic doctor --inventory")[0].output
    assert "sudo-rule" in doctor and "forced-command" in doctor


def test_the_heads_get_the_sudo_rule_checked_by_visudo(walked: Walk):
    for pattern in (r"visudo -cf", r"/etc/sudoers.d/mlx-medic$", r"^sudo visudo -c$"):
        assert {o.where for o in outcomes_of(walked, pattern)} == {"ai001", "ai005"}


def test_the_remediator_side_doctor_reaches_every_node(walked: Walk):
    (outcome,) = outcomes_of(walked, r"doctor --config.file")
    assert outcome.kind == RAN and outcome.exit == 0, outcome.report()
    for node in walked.cluster.nodes:
        assert node.name in outcome.output


def test_the_test_alert_through_alertmanager_ends_as_a_planned_dry_run(walked: Walk):
    (fired,) = outcomes_of(walked, r"amtool alert add .*--annotation")
    assert "planned: dry run:" in fired.output, fired.report()
    (followed,) = outcomes_of(walked, r"mlx-medic log --follow$")
    assert followed.exit == 0 and "glm-4_6-5b" in followed.output
    assert walked.oncall.alertnames() == {"LLMModelDown"}  # on-call got it too


def test_the_upgrade_renders_the_same_files_again(walked: Walk):
    (diff,) = outcomes_of(walked, r"^diff -ru rendered rendered.new$")
    assert diff.kind == RAN and diff.exit == 0 and diff.output == ""


def test_macos_commands_never_run_as_written(walked: Walk):
    for outcome in walked.outcomes:
        if re.search(r"launchctl|newsyslog|dseditgroup|/Library/", outcome.line.text):
            assert outcome.kind in (NOT_RUN, TRANSLATED), outcome.report()


def test_nothing_is_written_to_this_machines_etc_or_opt(walked: Walk):
    for path in ("/etc/mlx-medic", "/opt/mlx-medic", "/etc/sudoers.d/mlx-medic"):
        assert not Path(path).exists(), path
    assert "mlx-medic" not in Path("/etc/passwd").read_text().split(":")
