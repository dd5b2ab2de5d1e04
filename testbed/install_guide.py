"""docs/install.md followed on a three-user testbed, its commands read from the guide.

Why: the guide is what a person types on five Macs; this walk types the same lines, as far
as Linux allows, so a line that no longer works fails here first. `guide_lines` is the
one parser of the guide's code blocks (tests/test_install_guide.py uses it too). Every
line meets exactly one rule of `RULES`, the translation table, and gets one outcome per
place it runs: `ran` (the guide's line after the substitutions below, its exit code),
`translated` (another command ran instead, both shown, and why) or `not run on Linux`
(why). A line no rule matches, or a rule no line matches, stops the walk: nothing of the
guide is skipped in silence.

Where: "host" is this machine as the remediator's host (cwd: a checkout under the
workdir); a node line runs as root inside each testbed node (nsenter), or in the heads
only (ai001, ai005). The seed's five Macs are the testbed's nodes `SEED_NODES` (both
heads and ai004, which both models share; ai002 and ai003, glm's other peers, are left
out of the inventory to keep the walk short).

Substitutions (`Walk.substitute`), in every command line and in the checkout's
examples/inventory.yaml and deploy/remediator.yml:

- `/opt/mlx-medic/.venv/bin/mlx-medic`, `/opt/mlx/.venv/bin/python`: this venv's
  mlx-medic, this Python;
- `/etc/mlx-medic`, `/etc/prometheus`, `/etc/alertmanager`, `/etc/grafana`,
  `/etc/systemd/system`, `/var/lib/grafana`, `/var/lib/mlx-medic-remediator`: the same
  path under `<workdir>/guide/`;
- `/var/lib/mlx-medic` (a node's state dir): the node's private state dir;
- `/Users/ai`: the login user's home on the node;
- `192.168.101.N`: node aiNNN's 127.0.0.M, left out for a Mac the walk does not start (a
  node line's `192.168.101.1`: the node's own); `.10`, `.11` (the remediator's): 127.0.0.1;
- `127.0.0.1:10901`, `127.0.0.1:9093`: free ports on 127.0.0.1 (the remediator's,
  Alertmanager's);
- `ai001` and `$node` in a node line: that node's name;
- the user `ai`: the node's login user (`NodeUser`, mlx-medic); `sudo -u ai`: `setpriv` to it;
- `sudo`: nothing, the walk is root on the host and in the nodes (`sudo -u mlx-medic` on
  the host too: the remediator's user is not made here);
- `-g wheel`: `-g root` (Linux has no wheel group);
- `ONCALL_WEBHOOK_URL`: a sink on 127.0.0.1 that records Alertmanager's notifications.

Each model's `port` becomes a free port (the nodes share this machine's network). A
command that still names this machine's /etc, /opt, /Library, /Users or
/var/lib/mlx-medic is refused before it runs; in a node only its private
/etc/sudoers.d/mlx-medic is allowed (testbed/node_users.py).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from testbed.closing import ClosedOnExit
from testbed.cluster import Cluster, SimNode, TestbedError, start_cluster
from testbed.loop import (
    Daemon,
    OncallSink,
    host_daemon,
    start_alertmanager,
    start_exporter,
    unit_command,
)
from testbed.net import free_port
from testbed.node_users import NodeUser, run_as

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "install.md"
MEDIC = str(Path(sys.executable).parent / "mlx-medic")
SEED_NODES = ("ai001", "ai004", "ai005")
ALERT_MODEL = "glm-4_6-5b"  # the model of the guide's test alert
RAN, TRANSLATED, NOT_RUN = "ran", "translated", "not run on Linux"
# This machine's paths a command may never name once substituted.
FORBIDDEN = re.compile(r"(?<![\w.~/-])(/etc/|/opt/|/Library/|/Users/|/var/lib/mlx-medic)")
NODE_PRIVATE = "/etc/sudoers.d/mlx-medic"  # a node's own (a bind mount in its namespace)
GUIDE_DIRS = (
    "/etc/mlx-medic",
    "/etc/prometheus",
    "/etc/alertmanager",
    "/etc/grafana",
    "/etc/systemd/system",
    "/var/lib/grafana",
    "/var/lib/mlx-medic-remediator",
)


# --- the guide's code lines: one parser ------------------------------------------------


@dataclass(frozen=True)
class GuideLine:
    step: int  # the `## N.` section it is in
    block: int  # which code block of that section (0: its first)
    lineno: int  # in docs/install.md
    text: str


def guide_lines(text: str) -> list[GuideLine]:
    """The lines of the guide's indented code blocks (4 or more spaces after a blank
    line, in a list item too), with the step and block each is in."""
    lines: list[GuideLine] = []
    in_code, previous_blank, step, block = False, True, 0, -1
    for lineno, line in enumerate(text.splitlines(), 1):
        heading = re.match(r"## (\d+)\. ", line)
        if heading:
            step, block = int(heading.group(1)), -1
        indented = len(line) - len(line.lstrip(" ")) >= 4 and line.strip()
        if indented and (in_code or previous_blank):
            if not in_code:
                block += 1
            in_code = True
            lines.append(GuideLine(step, block, lineno, line.strip()))
        elif line.strip():
            in_code = False
        previous_blank = not line.strip()
    return lines


def code_lines(text: str) -> list[str]:
    return [line.text for line in guide_lines(text)]


# --- the translation table ---------------------------------------------------------------

Where = Literal["host", "nodes", "heads"]


@dataclass(frozen=True)
class Run:
    """The guide's line, substituted, where it says; `expect`: the exit the guide says."""

    where: Where
    expect: int = 0


@dataclass(frozen=True)
class Instead:
    """Another shell line stands in (`{line}`: the guide's own), substituted the same way."""

    where: Where
    command: str
    why: str
    expect: int = 0


@dataclass(frozen=True)
class Do:
    """A stand-in the walk does itself (starting a service, a background follower)."""

    where: Where
    action: Callable[[Walk, str, str], tuple[str, int | None, str]]  # (walk, place, line)
    why: str
    kind: str = TRANSLATED
    expect: int | None = 0


@dataclass(frozen=True)
class NotRun:
    why: str


Action = Run | Instead | Do | NotRun


@dataclass(frozen=True)
class Rule:
    step: int
    pattern: str  # a regular expression the guide line matches (re.search)
    action: Action
    block: int | None = None  # which code block of the step, where the line repeats
    prepare: str = ""  # a Walk method run once first: a stand-in for the guide's prose
    # The nodes share this machine's files outside their private dirs: a line that writes
    # one such file runs node after node, not on all at once.
    in_turn: bool = False


@dataclass
class Outcome:
    line: GuideLine
    kind: str
    where: str = ""
    command: str = ""
    exit: int | None = None
    expected: int | None = None
    output: str = ""  # stdout
    why: str = ""
    seconds: float = 0.0
    errors: str = ""  # stderr

    @property
    def as_guide_says(self) -> bool:
        return self.kind == NOT_RUN or self.exit == self.expected

    def report(self) -> str:
        head = f"install.md:{self.line.lineno} (step {self.line.step}) {self.line.text}"
        if self.kind == NOT_RUN:
            return f"{head}\n    not run on Linux: {self.why}"
        mark = "" if self.as_guide_says else f"  << expected {self.expected}"
        said = f"\n    why: {self.why}" if self.why else ""
        shown = self.output if self.output and self.exit == self.expected else self.errors
        out = "".join(f"\n      | {line}" for line in shown.splitlines()[-6:])
        return (
            f"{head}\n    {self.kind} on {self.where} (exit {self.exit},"
            f" {self.seconds:.1f} s){mark}:"
            f" {self.command}{said}{out}"
        )


WHEEL = (
    "the walk runs this checkout's venv (an editable install of this version);"
    " scripts/wheel_proof.py builds the wheel, installs it into an empty venv and runs it"
    " (tests/test_packaging.py)"
)
NO_MODEL = (
    "no model is served on the walk (no MLX model here, launchd is macOS's);"
    " tests/loop/test_whole_loop.py serves the tiny model with mlx-medic serve under"
    " supervisord on the testbed and remediates it for real"
)
SAME_AS_BEFORE = (
    "real action stays off, so this is the command steps 8 and 9 ran with the same config"
    " (exit 0 there); run once, not twice, to spare CI the time"
)
MAC_HOST = "the Mac variant of the remediator's host; the walk followed the Linux lines above"
NO_USER = (
    "the remediator's user mlx-medic is not made on this machine (useradd writes its"
    " /etc/passwd): the walk's remediator runs as root, who owns these files"
)
RENDER_DEFAULTS = (
    "{line} --alertmanager.credentials-file /etc/alertmanager/mlx-medic.token"
    " --prometheus.credentials-file /etc/prometheus/mlx-medic.token"
    " --remediator.config /etc/mlx-medic/remediator.yml"
    " --remediator.command /opt/mlx-medic/.venv/bin/mlx-medic"
    " --alertmanager.group-wait 1s"
)
RENDER_WHY = (
    "render's defaults for the first four flags are this machine's /etc and /opt paths;"
    " given, they pass through the table into the workdir. The routes' group_wait, 10s,"
    " is 1s: the test alert reaches the remediator 9 s sooner (CI's time)"
)


def _start_exporter(walk: Walk, place: str, line: str) -> tuple[str, int | None, str]:
    return walk.start_exporter(place)


def _restart_exporter(walk: Walk, place: str, line: str) -> tuple[str, int | None, str]:
    walk.daemons.pop(f"exporter {place}").stop()
    return walk.start_exporter(place)


def _start_remediator(walk: Walk, place: str, line: str) -> tuple[str, int | None, str]:
    return walk.start_remediator()


def _follow_log(walk: Walk, place: str, line: str) -> tuple[str, int | None, str]:
    return walk.start_follower(line)


def _fire_alert(walk: Walk, place: str, line: str) -> tuple[str, int | None, str]:
    return walk.fire_alert(line)


RULES: tuple[Rule, ...] = (
    # 2. Install
    Rule(2, r"pip wheel", NotRun(WHEEL)),
    Rule(2, r"^ls dist/", NotRun(WHEEL)),
    Rule(2, r"-m venv /opt/mlx-medic/.venv", NotRun(WHEEL)),
    Rule(2, r"/bin/pip install", NotRun(WHEEL)),
    Rule(2, r"mlx-medic --version$", Run("nodes")),
    Rule(
        2,
        r"mlx-medic exporter --once$",
        Instead(
            "nodes",
            "{line} --state-dir /var/lib/mlx-medic",
            "its default state dir, /var/lib/mlx-medic, is given so that it is the node's",
        ),
    ),
    # 3. The inventory and each node's id
    Rule(3, r"^sudo mkdir -p /etc/mlx-medic$", Run("host"), block=0),
    Rule(3, r"install -m 0644 examples/inventory.yaml", Run("host")),
    Rule(3, r"mlx-medic check-config /etc/mlx-medic/inventory.yaml$", Run("host")),
    Rule(3, r"^sudo mkdir -p /etc/mlx-medic$", Run("nodes"), block=1),
    Rule(
        3,
        r"install .* inventory.yaml /etc/",
        Run("nodes"),
        prepare="copy_inventory",
        in_turn=True,
    ),
    Rule(
        3,
        r"dseditgroup -o create mlx-medic",
        Instead(
            "nodes",
            "getent group mlx-medic",
            "the testbed's node has the group (its private /etc/group, testbed/node_users.py);"
            " the Linux lines the guide names, groupadd and usermod, would write this"
            " machine's /etc/gshadow",
        ),
    ),
    Rule(
        3,
        r"dseditgroup -o edit -a ai",
        Instead(
            "nodes",
            "id -Gn ai | grep -qw mlx-medic",
            "the login user is in the group already (testbed/node_users.py): checked",
        ),
    ),
    Rule(3, r"mkdir -p /var/lib/mlx-medic$", Run("nodes")),
    Rule(3, r"^echo ai001 \| sudo tee", Run("nodes")),
    Rule(3, r"chown -R ai:mlx-medic", Run("nodes")),
    Rule(3, r"chmod 2750", Run("nodes")),
    # 4. Keys
    Rule(4, r"mkdir -p /etc/mlx-medic/ssh$", Run("host")),
    Rule(4, r"ssh-keygen -t ed25519", Run("host")),
    Rule(4, r"chown -R mlx-medic", Instead("host", "sudo chmod 0700 /etc/mlx-medic/ssh", NO_USER)),
    Rule(4, r"^ssh-keyscan", Run("host")),
    Rule(4, r"ssh-keygen -lf", Run("host")),
    # 5. Render and install on the nodes
    Rule(5, r"mlx-medic render all", Instead("host", RENDER_DEFAULTS, RENDER_WHY)),
    Rule(5, r"chown -R \"\$\(id -un\)\" rendered", Run("host")),
    Rule(5, r"^node=ai001$", Run("nodes"), prepare="copy_rendered"),
    Rule(
        5,
        r"rendered/newsyslog/\$node",
        NotRun(
            "newsyslog is macOS's log rotation; the Linux unit"
            " (rendered/systemd/NODE/mlx-medic-exporter.service) logs to the journal"
        ),
    ),
    Rule(
        5,
        r"com.mlx-medic.exporter.plist /Library",
        NotRun(
            "/Library/LaunchDaemons is macOS's; the Linux equivalent,"
            " rendered/systemd/NODE/mlx-medic-exporter.service, starts at the next line"
        ),
    ),
    Rule(
        5,
        r"launchctl bootstrap system /Library/LaunchDaemons/com.mlx-medic.exporter",
        Do(
            "nodes",
            _start_exporter,
            "launchd is macOS's: the rendered systemd unit's ExecStart (the README's Linux"
            " equivalent), started as root inside the node (no systemd in a testbed node)",
        ),
    ),
    Rule(5, r"grep mlx_medic_collector_success$", Run("nodes")),
    Rule(5, r"^sudo -u ai sh -c", Run("nodes")),
    Rule(5, r"visudo -cf", Run("heads")),
    Rule(5, r"/etc/sudoers.d/mlx-medic$", Run("heads")),
    Rule(5, r"^sudo visudo -c$", Run("heads")),
    Rule(5, r"launchctl bootout system/com.valensas", NotRun(NO_MODEL)),
    Rule(5, r"com.valensas.vale.glm-4_6-5b.plist /Library", NotRun(NO_MODEL)),
    Rule(5, r"launchctl bootstrap system /Library/LaunchDaemons/com.valensas", NotRun(NO_MODEL)),
    Rule(5, r"^tail -f /Users/ai", NotRun(NO_MODEL)),
    Rule(5, r"serve_state\|medic_backend\|model_up", Run("heads")),
    # 6. Doctor
    Rule(6, r"mlx-medic doctor --inventory", Run("nodes")),
    # 7. Prometheus, Alertmanager, Grafana
    Rule(7, r"openssl rand -hex 32", Run("host")),
    Rule(7, r"mkdir -p /etc/alertmanager", Run("host")),
    Rule(7, r"webhook.token /etc/alertmanager", Run("host")),
    Rule(7, r"webhook.token /etc/prometheus", Run("host")),
    Rule(7, r"rendered/prometheus.yml", Run("host")),
    Rule(7, r"rendered/rules/", Run("host")),
    Rule(7, r"rendered/alertmanager.yml", Run("host")),
    Rule(7, r"^promtool check config", Run("host")),
    Rule(7, r"^amtool check-config", Run("host")),
    Rule(7, r"mkdir -p /var/lib/grafana", Run("host")),
    Rule(7, r"cp grafana/dashboards/", Run("host")),
    Rule(7, r"cp grafana/provisioning/dashboards", Run("host"), prepare="grafana_dirs"),
    Rule(7, r"cp grafana/provisioning/datasources", Run("host")),
    # 8. The remediator, in dry run
    Rule(8, r"^sed 's/\^dry_run: false/", Run("host")),
    Rule(8, r"mlx-medic check-config /etc/mlx-medic/remediator.yml$", Run("host")),
    Rule(8, r"openssl rand -base64 18", Run("host")),
    Rule(
        8,
        r"chown mlx-medic /etc/mlx-medic/oncall.password",
        Instead("host", "sudo chmod 0600 /etc/mlx-medic/oncall.password", NO_USER),
    ),
    Rule(8, r"mlx-medic-remediator.service /etc/systemd", Run("host"), prepare="systemd_dir"),
    Rule(
        8,
        r"systemctl enable --now mlx-medic-remediator",
        Do(
            "host",
            _start_remediator,
            "no systemd here: the installed unit's ExecStart with its Environment=, as"
            " root (User=mlx-medic is not made here), its StateDirectory= made as systemd"
            " would",
        ),
    ),
    Rule(
        8,
        r"^journalctl -u mlx-medic-remediator",
        Instead(
            "host",
            "tail -n 5 {remediator_log}",
            "no journald here: the remediator's output goes to its log file; -f never ends",
        ),
    ),
    Rule(8, r"install -d -o mlx-medic -m 0755", NotRun(MAC_HOST)),
    Rule(8, r"rendered/newsyslog/mlx-medic-remediator.conf", NotRun(MAC_HOST)),
    Rule(8, r"com.mlx-medic.remediator.plist /Library", NotRun(MAC_HOST)),
    Rule(8, r"launchctl bootstrap system /Library/LaunchDaemons/com.mlx-medic", NotRun(MAC_HOST)),
    Rule(8, r"^tail -f /var/lib/mlx-medic-remediator", NotRun(MAC_HOST)),
    Rule(8, r"mlx-medic doctor --config.file", Run("host")),
    # 9. A test alert
    Rule(
        9,
        r"mlx-medic log --follow$",
        Do(
            "host",
            _follow_log,
            "in the background, as in another terminal, until the test alert's run has"
            " ended; then Ctrl-C (SIGINT), as a person ends it",
        ),
    ),
    Rule(
        9,
        r"^amtool alert add .*--annotation",
        Do(
            "host",
            _fire_alert,
            "the guide's line; then the walk waits for the remediator's run of the alert",
            kind=RAN,
        ),
        prepare="alertmanager",
    ),
    Rule(9, r"^amtool alert add .*--end=", Run("host")),
    Rule(9, r"mlx-medic remediate glm-4_6-5b --dry-run$", Run("host")),
    # 10. Real action
    Rule(
        10,
        r"sed -i.bak",
        NotRun(
            "real action stays off: the walk serves no model for a recover to stop and"
            " start (tests/loop/test_whole_loop.py runs real remediations on the testbed)"
        ),
    ),
    Rule(10, r"mlx-medic check-config /etc/mlx-medic/remediator.yml$", NotRun(SAME_AS_BEFORE)),
    Rule(10, r"systemctl restart", NotRun("the config did not change: real action stays off")),
    Rule(10, r"mlx-medic remediate glm-4_6-5b --dry-run$", NotRun(SAME_AS_BEFORE)),
    Rule(
        10,
        r"mlx-medic remediate glm-4_6-5b$",
        NotRun("real action: the walk serves no model (tests/loop runs real remediations)"),
    ),
    Rule(10, r"mlx-medic log --model", Run("host")),
    # 11. Turn it off
    Rule(11, r"mlx-medic pause --reason", Run("host")),
    Rule(11, r"mlx-medic pause glm-4_6-5b", Run("host")),
    Rule(11, r"mlx-medic resume$", Run("host")),
    Rule(11, r"mlx-medic resume glm-4_6-5b$", Run("host")),
    # 12. Upgrade
    Rule(12, r"mlx-medic pause --reason", Run("host")),
    Rule(12, r"mlx-medic render all", Instead("host", RENDER_DEFAULTS, RENDER_WHY)),
    Rule(12, r"^diff -ru rendered rendered.new$", Run("host")),
    Rule(
        12,
        r"kickstart -k system/com.mlx-medic.exporter",
        Do("nodes", _restart_exporter, "launchd is macOS's: the exporter stopped and started"),
    ),
    Rule(12, r"kickstart -k system/com.valensas", NotRun(NO_MODEL)),
    Rule(12, r"mlx-medic doctor --inventory", Run("nodes")),
    Rule(12, r"mlx-medic check-config /etc/mlx-medic/remediator.yml$", Run("host")),
    Rule(12, r"remediate glm-4_6-5b --dry-run --force$", Run("host")),
    Rule(12, r"mlx-medic resume$", Run("host")),
)


def rule_for(line: GuideLine, rules: tuple[Rule, ...] = RULES) -> Rule:
    """The one rule of the table for `line`; TestbedError when none or several match."""
    matching = [
        rule
        for rule in rules
        if rule.step == line.step
        and rule.block in (None, line.block)
        and re.search(rule.pattern, line.text)
    ]
    if len(matching) != 1:
        said = "no rule" if not matching else f"{len(matching)} rules"
        raise TestbedError(
            f"install.md:{line.lineno}: {said} of testbed/install_guide.py's table for"
            f" {line.text!r}: add one, so that no line of the guide goes unwalked"
        )
    return matching[0]


def check_table(lines: list[GuideLine], rules: tuple[Rule, ...] = RULES) -> dict[int, Rule]:
    """Each line's rule; TestbedError when a line has none or a rule no line."""
    chosen = {line.lineno: rule_for(line, rules) for line in lines}
    unused = [rule for rule in rules if rule not in chosen.values()]
    if unused:
        raise TestbedError(f"rules that match no line of the guide: {unused}")
    return chosen


# --- the walk ----------------------------------------------------------------------------


@dataclass
class Walk(ClosedOnExit):
    cluster: Cluster
    root: Path  # <workdir>/guide: the guide's /etc, /var/lib, the checkout, admin homes
    user: NodeUser
    remediator_port: int = field(default_factory=free_port)
    alertmanager_port: int = field(default_factory=free_port)
    oncall: OncallSink = field(default_factory=OncallSink)
    daemons: dict[str, Daemon] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    stand_ins: list[str] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)
    _prepared: set[str] = field(default_factory=set)
    _follower: subprocess.Popen[str] | None = None

    # --- the table's substitutions ---------------------------------------------------
    @property
    def checkout(self) -> Path:
        return self.root / "checkout"

    @property
    def journal(self) -> Path:
        return self.path("/var/lib/mlx-medic-remediator") / "journal.sqlite"

    @property
    def remediator_log(self) -> Path:
        return self.root / "remediator.log"

    def path(self, guide_dir: str) -> Path:
        """Where one of the guide's GUIDE_DIRS is on the testbed."""
        return self.root / guide_dir.lstrip("/")

    def admin_home(self, node: str) -> Path:
        return self.root / "admin" / node

    def address(self, number: int, node: SimNode | None) -> str:
        if number in (10, 11):  # ssh.remediator_addresses: this machine
            return "127.0.0.1"
        if node is not None and number == 1:  # a node line's example address: its own
            return node.address
        name = f"ai{number:03d}"
        return self.cluster.node(name).address if name in self.node_names else ""

    @property
    def node_names(self) -> list[str]:
        return [node.name for node in self.cluster.nodes]

    def substitute(self, text: str, node: SimNode | None = None) -> str:
        """The table's substitutions; `node`: the line runs inside it."""

        def sudo(match: re.Match[str]) -> str:
            user = match.group(1)
            if user is None or (node is None and user == "mlx-medic"):
                return ""
            if node is not None and user == "ai":
                return shlex.join(run_as(self.user)) + " "
            raise TestbedError(f"no translation for `sudo -u {user}` in {text!r}")

        if node is not None:
            text = re.sub(r"\bai001\b", node.name, text.replace("$node", node.name))
        text = re.sub(r"\bsudo\s+(?:-u\s+(\S+)\s+)?", sudo, text)
        paths = {
            "/opt/mlx-medic/.venv/bin/mlx-medic": MEDIC,
            "/opt/mlx/.venv/bin/python": sys.executable,
            **{guide_dir: str(self.path(guide_dir)) for guide_dir in GUIDE_DIRS},
            "/var/lib/mlx-medic": str(self.cluster.head.state_mount),
            "/Users/ai": str(self.user.home),
        }
        for guide_path, here in paths.items():
            text = re.sub(rf"(?<![\w.~/-]){re.escape(guide_path)}(?![\w-])", here, text)
        text = re.sub(r"(?<=[\s~])ai(?=[\s:/]|$)", self.user.name, text)
        text = text.replace("-g wheel", "-g root")
        text = text.replace("127.0.0.1:10901", f"127.0.0.1:{self.remediator_port}")
        text = text.replace("127.0.0.1:9093", f"127.0.0.1:{self.alertmanager_port}")
        text = text.replace("ONCALL_WEBHOOK_URL", self.oncall.url)

        def address(match: re.Match[str]) -> str:
            here = self.address(int(match.group(1)), node)
            return here + match.group(2) if here else ""  # a Mac not started: left out

        return re.sub(r"192\.168\.101\.(\d+)\b( ?)", address, text)

    def env(self) -> dict[str, str]:
        # the on-call commands' default, /etc/mlx-medic/remediator.yml, in the workdir
        config = self.path("/etc/mlx-medic") / "remediator.yml"
        return self.cluster.env(MLX_MEDIC_CONFIG=str(config))

    # --- running ------------------------------------------------------------------------
    def places(self, where: Where) -> list[str]:
        return ["host"] if where == "host" else self.heads if where == "heads" else self.node_names

    def shell(self, command: str, place: str) -> tuple[int, str, str]:
        node = None if place == "host" else self.cluster.node(place)
        refuse_this_machines_paths(command, inside_node=node is not None)
        if node is None:
            argv, cwd = ["sh", "-c", command], self.checkout
        else:
            home = self.admin_home(node.name)
            argv, cwd = node.nsenter_argv("sh", "-c", command, cwd=home), home
        result = subprocess.run(
            argv, cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=180, check=False
        )
        return result.returncode, result.stdout.strip(), result.stderr.strip()

    def walk(self, text: str) -> list[Outcome]:
        lines = guide_lines(text)
        table = check_table(lines)
        for line in lines:
            rule = table[line.lineno]
            if rule.prepare and rule.prepare not in self._prepared:
                self._prepared.add(rule.prepare)
                getattr(self, rule.prepare)()
            self.outcomes += self.follow(line, rule.action, rule.in_turn)
        return self.outcomes

    def follow(self, line: GuideLine, action: Action, in_turn: bool = False) -> list[Outcome]:
        """`line`'s outcomes, one per place; the nodes' at once, as a person with a
        terminal on each would (the walk's time is CI's), unless `in_turn`."""
        if isinstance(action, NotRun):
            return [Outcome(line, NOT_RUN, why=action.why)]
        places = self.places(action.where)
        with ThreadPoolExecutor(max_workers=1 if in_turn else len(places)) as pool:
            return list(pool.map(lambda place: self.follow_at(line, action, place), places))

    def follow_at(self, line: GuideLine, action: Run | Instead | Do, place: str) -> Outcome:
        started = time.monotonic()
        node = None if place == "host" else self.cluster.node(place)
        if isinstance(action, Do):
            command, code, output = action.action(self, place, self.substitute(line.text, node))
            outcome = Outcome(
                line, action.kind, place, command, code, action.expect, output, action.why
            )
        else:
            kind, why = (RAN, "") if isinstance(action, Run) else (TRANSLATED, action.why)
            template = line.text if isinstance(action, Run) else action.command
            command = self.substitute(
                template.format(line=line.text, remediator_log=self.remediator_log), node
            )
            code, output, errors = self.shell(command, place)
            outcome = Outcome(line, kind, place, command, code, action.expect, output, why)
            outcome.errors = errors
        outcome.seconds = time.monotonic() - started
        return outcome

    # --- stand-ins for the guide's prose --------------------------------------------
    def stand_in(self, said: str) -> None:
        self.stand_ins.append(said)

    def prepare(self) -> None:
        """The checkout the host's lines run in, with the seed inventory and the
        remediator's example config translated by the table; the hostfiles."""
        self.checkout.mkdir(parents=True)
        for entry in REPO.iterdir():
            if entry.name not in (".git", "examples", "deploy") and not entry.name.startswith(
                "rendered"
            ):
                (self.checkout / entry.name).symlink_to(entry)
        (self.checkout / "examples").mkdir()
        (self.checkout / "deploy").mkdir()
        inventory = self.testbed_inventory()
        (self.checkout / "examples" / "inventory.yaml").write_text(inventory)
        remediator = self.substitute((REPO / "deploy" / "remediator.yml").read_text())
        (self.checkout / "deploy" / "remediator.yml").write_text(remediator)
        models = yaml.safe_load(inventory)["models"]
        self.heads = [
            n for n in self.node_names if any(m["nodes"][0] == n for m in models.values())
        ]
        for model in models.values():
            for backend, settings in model["backends"].items():
                self.cluster.hostfile(Path(settings["hostfile"]), model["nodes"], backend=backend)
        for node in self.node_names:
            self.admin_home(node).mkdir(parents=True)
        self.stand_in(
            f"the checkout: {self.checkout} (this repository's entries linked; its"
            " examples/inventory.yaml and deploy/remediator.yml translated by the table)"
        )
        self.stand_in("the hostfiles the inventory names: written by cluster.hostfile")

    def testbed_inventory(self) -> str:
        """examples/inventory.yaml through the table, on the nodes the testbed starts."""
        data = yaml.safe_load(self.substitute((REPO / "examples" / "inventory.yaml").read_text()))
        config = str(self.path("/etc/mlx-medic") / "inventory.yaml")
        data["nodes"] = {
            name: {**spec, "user": self.user.name, "medic_config": config}
            for name, spec in data["nodes"].items()
            if name in self.node_names
        }
        data["ssh"]["remediator_addresses"] = ["127.0.0.1"]
        for name, model in list(data["models"].items()):
            head = model["nodes"][0]
            model["nodes"] = [node for node in model["nodes"] if node in self.node_names]
            if head not in self.node_names:
                del data["models"][name]
                continue
            model["service"]["user"] = self.user.name
            model["port"] = free_port()
        return yaml.safe_dump(data, sort_keys=False)

    def copy_inventory(self) -> None:
        for node in self.node_names:
            shutil.copy(self.path("/etc/mlx-medic") / "inventory.yaml", self.admin_home(node))
        self.stand_in("inventory.yaml copied to each node's admin home (the guide's prose)")

    def copy_rendered(self) -> None:
        for node in self.node_names:
            shutil.copytree(self.checkout / "rendered", self.admin_home(node) / "rendered")
        self.stand_in("rendered/ copied to each node's admin home (the guide's rsync)")

    def grafana_dirs(self) -> None:
        for kind in ("dashboards", "datasources"):
            (self.path("/etc/grafana") / "provisioning" / kind).mkdir(parents=True, exist_ok=True)
        self.stand_in("/etc/grafana/provisioning/{dashboards,datasources}: Grafana's package's")

    def systemd_dir(self) -> None:
        self.path("/etc/systemd/system").mkdir(parents=True, exist_ok=True)
        self.stand_in("/etc/systemd/system: systemd's own dir")

    def alertmanager(self) -> None:
        config = self.path("/etc/alertmanager") / "alertmanager.yml"
        self.daemons["alertmanager"] = start_alertmanager(self.root, config, self.alertmanager_port)
        self.stand_in(
            f"Alertmanager (step 7's reload) with {config} on"
            f" 127.0.0.1:{self.alertmanager_port}, its cluster port off; Prometheus and"
            " Grafana are not started (the test alert goes straight into Alertmanager)"
        )

    # --- the Do actions ------------------------------------------------------------------
    def start_exporter(self, node: str) -> tuple[str, int | None, str]:
        unit = self.admin_home(node) / "rendered" / "systemd" / node / "mlx-medic-exporter.service"
        daemon = start_exporter(
            self.cluster.node(node), unit, self.root / f"exporter-{node}.log", self.env()
        )
        self.daemons[daemon.name] = daemon
        return shlex.join(unit_command(unit)[0]), 0, f"listening (host pid {daemon.pid})"

    def start_remediator(self) -> tuple[str, int | None, str]:
        unit = self.path("/etc/systemd/system") / "mlx-medic-remediator.service"
        argv, unit_env = unit_command(unit)
        self.path("/var/lib/mlx-medic-remediator").mkdir(mode=0o755, parents=True, exist_ok=True)
        daemon = host_daemon(
            self.root, "remediator", argv, self.remediator_port, env={**self.env(), **unit_env}
        )
        self.daemons["remediator"] = daemon
        shown = " ".join(f"{k}={v}" for k, v in unit_env.items())
        return f"{shown} {shlex.join(argv)}", 0, f"listening on 127.0.0.1:{self.remediator_port}"

    def start_follower(self, command: str) -> tuple[str, int | None, str]:
        refuse_this_machines_paths(command, inside_node=False)
        popen = subprocess.Popen(
            ["sh", "-c", f"exec {command}"],
            cwd=self.checkout,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._follower = popen
        return command, None, "(following)"

    def stop_follower(self) -> None:
        """Ctrl-C to the log follower; its exit and output go to its line's outcome."""
        if self._follower is None:
            return
        popen, self._follower = self._follower, None
        popen.send_signal(signal.SIGINT)
        try:
            output, _ = popen.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            popen.kill()
            output, _ = popen.communicate()
        for outcome in self.outcomes:
            if outcome.exit is None and outcome.output == "(following)":
                outcome.exit, outcome.output = popen.returncode, output.strip()

    def fire_alert(self, command: str) -> tuple[str, int | None, str]:
        """The guide's `amtool alert add`, then the wait for the remediator's run."""
        code, output, errors = self.shell(command, "host")
        if code != 0:
            return command, code, errors
        run = self.wait_for_run(ALERT_MODEL, timeout=90)
        self.stop_follower()  # the person watching it has seen the run end
        said = f"the remediator's run {run.id}: {run.outcome}: {run.detail}"
        return command, code, f"{output}\n{said}".strip()

    def wait_for_run(self, model: str, timeout: float) -> RunSeen:
        from mlx_medic.remediator.journal import Journal
        from mlx_medic.remediator.outcomes import RUN_IN_FLIGHT

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.journal.exists():
                journal = Journal(self.journal)
                try:
                    runs = journal.list_runs(model=model, limit=1)
                finally:
                    journal.close()
                if runs and runs[0].outcome not in RUN_IN_FLIGHT:
                    return RunSeen(runs[0].id, str(runs[0].outcome), runs[0].detail)
            time.sleep(0.5)
        raise TestbedError(
            f"no run of {model} ended within {timeout:.0f}s of the test alert;"
            f" remediator log:\n{self.daemons['remediator'].tail()}"
        )

    def close(self) -> None:
        self.stop_follower()
        for daemon in reversed(list(self.daemons.values())):
            daemon.stop()
        self.daemons.clear()
        self.oncall.close()


def refuse_this_machines_paths(command: str, *, inside_node: bool) -> None:
    """TestbedError before a command that names this machine's /etc, /opt, ... runs (a
    gap in the table); inside a node its private /etc/sudoers.d/mlx-medic is allowed."""
    refused = FORBIDDEN.search(command.replace(NODE_PRIVATE, "") if inside_node else command)
    if refused:
        raise TestbedError(f"refused to run {command!r}: it names this machine's {refused[1]}")


@dataclass(frozen=True)
class RunSeen:
    id: int
    outcome: str
    detail: str


def walk_guide(workdir: Path, nodes: tuple[str, ...] = SEED_NODES) -> Walk:
    """Start a three-user cluster of `nodes`, walk the guide on it and return the walk
    (its outcomes); the cluster and everything the walk started are gone on return."""
    cluster = start_cluster(len(nodes), workdir, names=list(nodes), node_user=NodeUser())
    try:
        assert cluster.node_user is not None
        walk = Walk(cluster, workdir / "guide", cluster.node_user)
        with walk:
            walk.prepare()
            walk.walk(GUIDE.read_text())
            walk.stop_follower()
        return walk
    finally:
        cluster.close()


def report(walk: Walk) -> str:
    parts = [f"stand-in: {said}" for said in walk.stand_ins]
    parts += [outcome.report() for outcome in walk.outcomes]
    wrong = [o for o in walk.outcomes if not o.as_guide_says]
    counts = {
        kind: sum(o.kind == kind for o in walk.outcomes) for kind in (RAN, TRANSLATED, NOT_RUN)
    }
    parts.append(
        f"{len(walk.outcomes)} outcomes: "
        + ", ".join(f"{n} {kind}" for kind, n in counts.items())
        + (f"; {len(wrong)} not as the guide says" if wrong else "; every exit as the guide says")
    )
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed install-guide", description=__doc__)
    parser.add_argument("--workdir", type=Path, help="default: /var/tmp/mlx-medic-guide-<token>")
    args = parser.parse_args(argv)
    return run(args.workdir)


def run(workdir: Path | None) -> int:
    """The walk on a fresh cluster, its report printed; 0 when every exit is the guide's.
    The workdir is removed afterwards unless it was given."""
    path = workdir or Path("/var/tmp") / f"mlx-medic-guide-{uuid.uuid4().hex[:10]}"
    try:
        walk = walk_guide(path)
    except TestbedError as exc:
        print(f"install guide walk: {exc}", file=sys.stderr)
        return 1
    finally:
        if workdir is None:
            shutil.rmtree(path, ignore_errors=True)
    print(report(walk))
    return 0 if all(o.as_guide_says for o in walk.outcomes) else 1
