"""The doctor's checks of a node's setup hold it to what the inventory and `mlx-medic
render` say: mlx-medic at medic_command, the inventory at medic_config, MLX in the ranks'
interpreter, the sudo rule (`sudo -n -l` listings captured from a real sudo, in
tests/fixtures/sudo/), the keys' forced command, and what the exporter can see."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from mlx_medic import __version__
from mlx_medic.doctor.commands import VERSIONED_PACKAGES, VERSIONS_SCRIPT
from mlx_medic.doctor.framework import CHECKS, FAILED, NOT_APPLICABLE, PASSED, SKIPPED, run_check
from mlx_medic.doctor.keys_and_sudo import parse_key_options, parse_sudo_listing
from mlx_medic.doctor.node_setup import TIMEOUT  # noqa: F401  (registers the checks)
from mlx_medic.platform.commands import CompletedCommand
from mlx_medic.render.authorized_keys import forced_command, key_options
from tests.doctor.fakes import MEDIC, PYTHON, Machine, context, fixture_output, inventory, ok
from tests.render.helpers import EXAMPLE, EXAMPLE_KEY, render_example, render_ok
from tests.render.test_authorized_keys import public_key

VERSION = (MEDIC, "--version")
VERSIONS = (PYTHON, "-c", VERSIONS_SCRIPT, *VERSIONED_PACKAGES)


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    inventory(tmp_path / "inventory.yaml")
    return tmp_path / "inventory.yaml"


def only(name: str, machine: Machine | None = None, **kwargs):
    (result,) = run_check(CHECKS[name], context(machine, **kwargs))
    return result


# --- medic_command and medic_config ------------------------------------------------------------


def test_medic_command_running_this_version_passes(cluster: Path):
    machine = Machine({VERSION: ok(VERSION, f"mlx-medic {__version__}\n")})
    result = only("medic-command", machine, inventory_path=cluster)
    assert (result.status, result.detail) == (PASSED, f"{MEDIC}: mlx-medic {__version__}")


def test_medic_command_of_another_version_or_none_at_all_fails(cluster: Path):
    older = Machine({VERSION: ok(VERSION, "mlx-medic 0.0.1\n")})
    result = only("medic-command", older, inventory_path=cluster)
    assert result.status == FAILED and "'mlx-medic 0.0.1'" in result.detail
    assert "one mlx-medic version" in result.fix
    missing = only("medic-command", Machine(), inventory_path=cluster)
    assert (missing.status, missing.detail) == (FAILED, f"{MEDIC} is not installed")


def test_without_an_inventory_the_setup_checks_are_skipped_saying_why():
    for name in ("medic-command", "medic-config", "sudo-rule", "forced-command"):
        result = only(name)
        assert result.status == SKIPPED and "no --inventory" in result.detail


def test_medic_config_must_hold_the_inventory_given(cluster: Path, tmp_path: Path):
    there = tmp_path / "etc-inventory.yaml"
    inventory_text = cluster.read_text().replace(
        "ssh: 10.0.0.11", f"medic_config: {there}\n    ssh: 10.0.0.11"
    )
    cluster.write_text(inventory_text)
    missing = only("medic-config", inventory_path=cluster)
    assert (missing.status, missing.detail) == (FAILED, f"{there} does not exist")
    there.write_text(inventory_text + "# edited by hand\n")
    assert only("medic-config", inventory_path=cluster).detail == f"{there} differs from {cluster}"
    there.write_text(inventory_text)
    assert only("medic-config", inventory_path=cluster).status == PASSED


# --- the ranks' interpreter --------------------------------------------------------------------


def versions(**found: str | None) -> CompletedCommand:
    return ok(VERSIONS, json.dumps({"python": "3.12.8", **found}))


def test_the_interpreter_with_mlx_mlx_lm_and_this_mlx_medic_passes(cluster: Path):
    machine = Machine(
        {VERSIONS: versions(mlx="0.29.2", **{"mlx-lm": "0.28.1"}, **{"mlx-medic": __version__})}
    )
    result = only("interpreter", machine, inventory_path=cluster)
    assert (result.name, result.status) == (f"interpreter {PYTHON}", PASSED), result
    assert result.detail == (
        f"Python 3.12.8, mlx 0.29.2, mlx-lm 0.28.1, mlx-medic {__version__} (for glm)"
    )


def test_an_interpreter_without_mlx_lm_fails_saying_what_to_install(cluster: Path):
    machine = Machine(
        {VERSIONS: versions(mlx="0.29.2", **{"mlx-lm": None, "mlx-medic": __version__})}
    )
    result = only("interpreter", machine, inventory_path=cluster)
    assert result.status == FAILED and result.detail.startswith("mlx-lm not installed")
    assert f"{PYTHON} -m pip install mlx mlx-lm mlx-medic=={__version__}" in result.fix


def test_an_interpreter_that_is_not_there_fails(cluster: Path):
    result = only("interpreter", Machine(), inventory_path=cluster)
    assert result.status == FAILED and "is not installed" in result.detail


def test_the_versions_script_runs_in_a_real_interpreter():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", VERSIONS_SCRIPT, *VERSIONED_PACKAGES],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert set(json.loads(out)) == {"python", *VERSIONED_PACKAGES}


# --- the sudo rule -----------------------------------------------------------------------------


# The example inventory's ai001 heads glm-4_6-5b under launchd; its login user is ai.
LIST_AS_ROOT = ("sudo", "-n", "-l", "-U", "ai")
LIST_AS_AI = ("sudo", "-n", "-l")


def test_the_rendered_rule_as_sudo_lists_it_passes_as_root_and_as_the_login_user():
    listing = fixture_output("sudo_n_l_launchd_rule.txt")
    as_root = only(
        "sudo-rule", Machine({LIST_AS_ROOT: ok(LIST_AS_ROOT, listing)}), inventory_path=EXAMPLE
    )
    assert (as_root.status, as_root.detail) == (
        PASSED,
        "ai may run exactly the 3 rendered commands",
    )
    as_ai = Machine({LIST_AS_AI: ok(LIST_AS_AI, listing)})
    assert only("sudo-rule", as_ai, inventory_path=EXAMPLE, user="ai").status == PASSED
    assert as_ai.calls == [(None, LIST_AS_AI)]


def test_a_listing_of_another_models_rule_fails_naming_what_is_missing_and_extra():
    listing = fixture_output("sudo_n_l_escaped_label.txt")  # /bin/systemctl ... mlx\:m1
    result = only(
        "sudo-rule", Machine({LIST_AS_ROOT: ok(LIST_AS_ROOT, listing)}), inventory_path=EXAMPLE
    )
    assert result.status == FAILED
    assert (
        "ai may not run without a password: /bin/launchctl bootout"
        " system/com.valensas.vale.glm-4_6-5b" in result.detail
    )
    assert r"ai may also run: (root) NOPASSWD: /bin/systemctl stop mlx\:m1" in result.detail
    assert "sudoers.d/mlx-medic" in result.fix


def test_no_rule_at_all_fails_quoting_sudo():
    said = fixture_output("sudo_n_l_no_rule.txt")
    machine = Machine({LIST_AS_ROOT: CompletedCommand(LIST_AS_ROOT, 1, "", said)})
    result = only("sudo-rule", machine, inventory_path=EXAMPLE)
    assert result.status == FAILED
    assert result.detail == (
        "ai has no sudo rule here: `sudo -n -l -U ai` exited 1: 'sudo: a password is required'"
    )


def test_sudo_not_installed_fails_saying_so_and_how_to_install_it():
    result = only("sudo-rule", Machine({}), inventory_path=EXAMPLE)
    assert result.status == FAILED
    assert result.detail.startswith("sudo is not installed (not found on PATH)")
    assert result.fix.startswith("install sudo") and "sudoers.d/mlx-medic" in result.fix


def test_sudo_rule_is_skipped_for_another_user_and_not_applicable_on_a_peer(cluster: Path):
    assert only("sudo-rule", inventory_path=EXAMPLE, user="ops").status == SKIPPED
    peer = only("sudo-rule", inventory_path=cluster, node="ai002")
    assert peer.status == NOT_APPLICABLE


def test_the_sudo_listing_reader_splits_tags_and_commands_as_sudo_writes_them():
    rules = parse_sudo_listing(fixture_output("sudo_n_l_escaped_label.txt"))
    assert (rules[0].runas, rules[0].tags, rules[0].command) == (
        "root",
        ("NOPASSWD",),
        r"/bin/systemctl stop mlx\:m1",
    )


# --- the forced command ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mlx-medic render authorized-keys` of the example inventory."""
    return render_example("authorized-keys", tmp_path_factory.mktemp("keys")) / "authorized-keys"


def home_with(tmp_path: Path, text: str) -> Path:
    (tmp_path / ".ssh").mkdir(parents=True, exist_ok=True)
    (tmp_path / ".ssh" / "authorized_keys").write_text(text)
    return tmp_path


def test_the_rendered_authorized_keys_pass_on_the_head_and_on_a_peer(
    rendered_keys: Path, tmp_path: Path
):
    for node in ("ai001", "ai002"):
        home = home_with(tmp_path / node, (rendered_keys / node / "authorized_keys").read_text())
        result = only(
            "forced-command", inventory_path=EXAMPLE, node=node, home_of=lambda u, h=home: h
        )
        assert result.status == PASSED, result


def test_on_a_peer_the_serve_wrappers_key_is_checked_too(tmp_path: Path):
    identity = tmp_path / "serve_ed25519"
    Path(f"{identity}.pub").write_text(public_key(2, "serve") + "\n")
    path = tmp_path / "inventory.yaml"
    inventory(path, serve={"python": PYTHON, "identity_file": str(identity)})
    out = render_ok("authorized-keys", path, tmp_path / "out", "--ssh.public-key", str(EXAMPLE_KEY))
    text = (out / "authorized-keys" / "ai002" / "authorized_keys").read_text()
    home = home_with(tmp_path / "home", text)
    result = only("forced-command", inventory_path=path, node="ai002", home_of=lambda u: home)
    assert result.status == PASSED and "the remediator and serve keys" in result.detail

    without_serve = "\n".join(line for line in text.splitlines() if "--key serve" not in line)
    home_with(home, without_serve)
    result = only("forced-command", inventory_path=path, node="ai002", home_of=lambda u: home)
    assert result.status == FAILED and "no key line runs" in result.detail
    assert "--key serve" in result.detail and "render authorized-keys" in result.fix


def test_a_key_line_without_restrictions_or_from_another_address_fails(
    rendered_keys: Path, tmp_path: Path
):
    line = next(
        line
        for line in (rendered_keys / "ai001" / "authorized_keys").read_text().splitlines()
        if "--key remediator" in line
    )
    loose = line.replace("restrict,no-user-rc,", "").replace('from="', 'from="192.0.2.9,')
    home = home_with(tmp_path, loose + "\n")
    result = only("forced-command", inventory_path=EXAMPLE, home_of=lambda u: home)
    assert result.status == FAILED
    assert "the remediator key's options are `from=" in result.detail
    assert "also allows 192.0.2.9" in result.detail


def test_a_missing_or_unreadable_authorized_keys(tmp_path: Path):
    missing = only("forced-command", inventory_path=EXAMPLE, home_of=lambda u: tmp_path)
    assert missing.status == FAILED and missing.detail.endswith(
        ".ssh/authorized_keys does not exist"
    )

    class Home(type(tmp_path)):  # a home whose files the doctor may not read
        def read_text(self, *args, **kwargs):
            raise PermissionError(13, "Permission denied")

    locked = only(
        "forced-command", inventory_path=EXAMPLE, user="ops", home_of=lambda u: Home(tmp_path)
    )
    assert locked.status == SKIPPED and "run the doctor as root or ai" in locked.detail


def test_key_options_are_read_as_sshd_reads_them():
    command = forced_command(MEDIC, "/etc/mlx-medic/inventory.yaml", "remediator")
    written = key_options(command, ["10.0.0.5", "10.0.0.0/24"])
    options = parse_key_options(f"{written} {EXAMPLE_KEY.read_text().strip()}")
    assert (options.text, options.command, options.addresses) == (
        written,
        command,
        ["10.0.0.5", "10.0.0.0/24"],
    )
    assert parse_key_options("ssh-ed25519 AAAA me").options == {}


# --- what the exporter sees ----------------------------------------------------------------------


class Process:
    """A psutil.Process as the checks use it."""

    def __init__(self, pid: int, username: str, readable: bool = True):
        self.pid, self.info, self.readable = pid, {"pid": pid, "username": username}, readable

    def cmdline(self) -> list[str]:
        if not self.readable:
            raise psutil.AccessDenied(self.pid)
        return ["python3", "serve.py"]

    def environ(self) -> dict[str, str]:
        return self.cmdline() and {}


def table(*processes: Process):
    return lambda attrs=None: list(processes)


def test_the_service_users_processes_readable_pass(cluster: Path):
    result = only(
        "process-visibility",
        inventory_path=cluster,
        process_iter=table(Process(7, "_otelcol-sumo"), Process(8, "root")),
    )
    assert (result.name, result.status) == ("process-visibility _otelcol-sumo", PASSED)
    assert result.detail == "as root: all 1 of _otelcol-sumo's processes"


def test_processes_that_refuse_their_command_line_fail_and_none_running_is_skipped(cluster: Path):
    denied = only(
        "process-visibility",
        inventory_path=cluster,
        user="ops",
        process_iter=table(Process(7, "_otelcol-sumo", readable=False)),
    )
    assert denied.status == FAILED and "(pid 7)" in denied.detail and "as root" in denied.fix
    idle = only("process-visibility", inventory_path=cluster)
    assert idle.status == SKIPPED and "no process of _otelcol-sumo runs now" in idle.detail


def test_the_models_port_seen_listening_passes_and_an_unknown_answer_fails(cluster: Path):
    rank = Process(41, "_otelcol-sumo")
    seen = only(
        "listening-sockets",
        inventory_path=cluster,
        process_iter=table(rank),
        listening=lambda: lambda pid, port: pid == 41 and port == 8080,
    )
    assert (seen.name, seen.status, seen.detail) == (
        "listening-sockets glm",
        PASSED,
        "pid 41 listens on port 8080",
    )
    blind = only(
        "listening-sockets",
        inventory_path=cluster,
        process_iter=table(rank),
        listening=lambda: lambda pid, port: None,
    )
    assert blind.status == FAILED and "cannot tell" in blind.detail
    down = only("listening-sockets", inventory_path=cluster, process_iter=table(rank))
    assert down.status == SKIPPED and "run again while the model serves" in down.detail
