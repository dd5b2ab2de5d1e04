"""docs/install.md stays true of the code: every `mlx-medic` command line in its code
blocks parses with the real CLI parser, every repository path it names exists, and every
`rendered/` path it names is one `mlx-medic render all` writes for the example inventory
(with the flags deploy/ was made with: scripts/render-deploy.sh), installed where its header
comment says; the guide's own render commands render the example inventory."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from mlx_medic.cli import COMMANDS, main, parse_args
from mlx_medic.inventory.load import load_inventory
from testbed import cluster as testbed_cluster
from testbed.install_guide import (
    GuideLine,
    check_table,
    code_lines,
    guide_lines,
    refuse_this_machines_paths,
)
from tests.render.helpers import EXAMPLE, EXAMPLE_KEY, REPO, render_example

GUIDE = REPO / "docs" / "install.md"  # its code lines: testbed.install_guide.code_lines
# The guide's placeholders, as a reader fills them in.
PLACEHOLDERS = {
    "$node": "ai001",
    "ONCALL_WEBHOOK_URL": "https://oncall.example/hook",
    "ADMIN": "admin",
    "YOU": "you",
    "REMEDIATOR_HOST": "remediator.example",
}
SHELL_OPERATORS = ("|", "&", ";", ">", "<", "2>")
EXITS_WHILE_PARSING = {"--help", "-h", "--version"}  # argparse prints and exits
TOP_DIRS = (
    "alerting-rules|bench|deploy|docs|examples|exporter|grafana|mlx_medic|remediator"
    "|scripts|testbed|tests"
)
REPO_PATH = re.compile(rf"(?<![\w/.$-])(?:{TOP_DIRS})/[\w./*-]*")
RENDERED_PATH = re.compile(r"(?<![\w/.$-])rendered/[\w./$-]*")
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)]*))?\)")


def guide_text() -> str:
    return GUIDE.read_text()


def fill(line: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    return line


def medic_argvs(text: str) -> list[list[str]]:
    """Each `/path/to/bin/mlx-medic ...` in the code blocks (a bare `mlx-medic` there is
    the user or group, a sudoers file of that name is no command), its arguments up to the
    first shell operator or comment."""
    found = []
    for line in code_lines(text):
        words = shlex.split(fill(line), comments=True)
        for index, word in enumerate(words):
            if Path(word).name != "mlx-medic" or Path(word).parent.name != "bin":
                continue
            argv = []
            for arg in words[index + 1 :]:
                if arg.startswith(SHELL_OPERATORS):
                    break
                argv.append(arg)
            found.append(argv)
    return found


def parses(argv: list[str]) -> str | None:
    """None when the real parser takes `argv`, else what it said."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse_args(argv)
    except SystemExit:
        return stderr.getvalue().strip() or "exited while parsing"
    return None


def test_the_guide_has_the_steps_the_issue_asks_for():
    headings = re.findall(r"^## (\d+)\. ", guide_text(), flags=re.M)
    assert headings == [str(n) for n in range(1, 13)]


def test_the_guide_says_what_has_not_been_run_on_a_mac():
    assert "Nothing in this guide has been run on a real Mac" in guide_text()


def test_every_mlx_medic_command_line_parses_with_the_real_cli_parser():
    argvs = medic_argvs(guide_text())
    assert len(argvs) >= 20, argvs  # the extraction found the guide's commands
    used = {argv[0] for argv in argvs}
    assert {"render", "check-config", "doctor", "log", "remediate", "pause", "resume"} <= used
    unknown = [
        argv for argv in argvs if not argv or argv[0] not in {*COMMANDS, *EXITS_WHILE_PARSING}
    ]
    assert not unknown, f"not mlx-medic commands: {unknown}"
    refused = {
        shlex.join(argv): said
        for argv in argvs
        if not EXITS_WHILE_PARSING & set(argv)
        for said in [parses(argv)]
        if said is not None
    }
    assert not refused, refused


def test_a_command_line_the_parser_refuses_is_caught():
    (argv,) = medic_argvs("text\n\n    sudo /opt/v/bin/mlx-medic doctor --no-such-flag\n")
    assert parses(argv) is not None


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation gone, spaces hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_repository_path_the_guide_names_exists():
    text = guide_text()
    named = {match.rstrip(".") for match in REPO_PATH.findall(text)}
    assert "docs/security.md" in named
    missing = sorted(path for path in named if not list(REPO.glob(path)))
    missing += sorted(
        path for path, _ in LINK.findall(text) if path and not (GUIDE.parent / path).exists()
    )
    assert not missing, missing


def test_every_link_to_a_step_names_a_heading_of_the_guide():
    text = guide_text()
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    linked = {anchor for path, anchor in LINK.findall(text) if not path and anchor}
    assert len(linked) >= 12
    assert linked <= anchors, sorted(linked - anchors)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every file and dir `render all` writes for the example inventory, relative."""
    out = render_example("all", tmp_path_factory.mktemp("render") / "rendered")
    paths = {str(path.relative_to(out.parent)) for path in out.rglob("*")}
    return paths | {path + "/" for path in paths if (out.parent / path).is_dir()}


def test_every_rendered_path_the_guide_names_is_one_render_writes(rendered: set[str]):
    nodes = [node.name for node in load_inventory(EXAMPLE).nodes]
    named = {match.rstrip(".") for match in RENDERED_PATH.findall(guide_text())}
    named.discard("rendered/")
    assert "rendered/launchd/$node/com.mlx-medic.exporter.plist" in named
    missing = sorted(
        path.replace("$node", node)
        for path in named
        for node in (nodes if "$node" in path else [""])
        if path.replace("$node", node) not in rendered
    )
    assert not missing, f"render all does not write {missing}"


def test_the_guides_render_commands_render_the_example_inventory(tmp_path: Path):
    """Run as written, with this checkout's example inventory and key for the host's."""
    here = {
        "/etc/mlx-medic/inventory.yaml": str(EXAMPLE),
        "/etc/mlx-medic/ssh/id_ed25519.pub": str(EXAMPLE_KEY),
    }
    commands = [argv for argv in medic_argvs(guide_text()) if argv[0] == "render"]
    assert len(commands) == 2  # the install's and the upgrade's
    for index, argv in enumerate(commands):
        out = tmp_path / str(index)
        argv = [here.get(arg, arg) for arg in argv]
        argv[argv.index("--out") + 1] = str(out)
        stderr = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            assert main(argv) == 0, stderr.getvalue()
        assert (out / "launchd" / "ai001" / "com.mlx-medic.exporter.plist").is_file()


def installs(text: str) -> list[tuple[str, str]]:
    """(rendered file, destination) of each `install ... rendered/FILE DEST` line."""
    found = []
    for line in code_lines(text):
        words = shlex.split(fill(line), comments=True)
        if "install" in words and words[-2].startswith("rendered/"):
            found.append((words[-2], words[-1]))
    return found


def test_each_rendered_file_is_installed_where_its_header_says(tmp_path: Path):
    out = render_example("all", tmp_path / "rendered")
    said = [
        (source, destination, header)
        for source, destination in installs(guide_text())
        # prometheus.yml, alertmanager.yml and the rules go where those tools read them
        if "Install" in (header := (out.parent / source).read_text())
    ]
    assert len(said) >= 7  # two newsyslog files, three launchd jobs, sudoers, a systemd unit
    for source, destination, header in said:
        assert destination in header or str(Path(destination).parent) in header, (
            f"{source}: the guide installs it as {destination}, its header says otherwise"
        )


def test_every_line_of_the_guide_has_one_rule_of_the_walks_table():
    """testbed/install_guide.py walks every line; a new line without a rule stops it."""
    lines = guide_lines(guide_text())
    assert [line.text for line in lines] == code_lines(guide_text())
    assert len(check_table(lines)) == len(lines)
    new = GuideLine(step=7, block=9, lineno=999, text="sudo rm -rf /etc/prometheus")
    with pytest.raises(testbed_cluster.TestbedError, match="no rule"):
        check_table([*lines, new])
    with pytest.raises(testbed_cluster.TestbedError, match="match no line"):
        check_table(lines[:-1])


def test_the_walk_refuses_a_command_that_names_this_machines_etc_or_opt():
    for command in (
        "install -m 0644 x /etc/prometheus/p.yml",
        "ls /opt/mlx-medic",
        "cat /Users/ai/x",
    ):
        with pytest.raises(testbed_cluster.TestbedError, match="refused to run"):
            refuse_this_machines_paths(command, inside_node=False)
    refuse_this_machines_paths("mkdir -p /var/tmp/w/guide/etc/mlx-medic", inside_node=False)
    sudoers = "install -m 0440 rendered/sudoers/ai001/mlx-medic /etc/sudoers.d/mlx-medic"
    refuse_this_machines_paths(sudoers, inside_node=True)  # the node's own, a bind mount
    with pytest.raises(testbed_cluster.TestbedError):
        refuse_this_machines_paths(sudoers, inside_node=False)
