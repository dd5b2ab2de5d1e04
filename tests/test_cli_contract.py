"""The command-line contract (docs/exit-codes.md): every command and every node helper
answers `--help` and `--version`, and says a bad flag, a missing file, a taken port and a
refused one in one line with the documented exit code, never with a traceback.

Every run is the real CLI in a subprocess. Tests run as root, so a refused bind is made
by dropping the privilege in the child (`setpriv` takes CAP_NET_BIND_SERVICE out of its
bounding set), never by expecting root to be refused a low port.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from mlx_medic.cli import COMMANDS
from mlx_medic.command_line import EXIT_BUSY, EXIT_OK, EXIT_USAGE
from mlx_medic.logs import setup_logging
from mlx_medic.node.cli import HELPERS
from tests.tools import require_tool

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
MISSING = "/nonexistent-mlx-medic-test/file.yaml"
EXAMPLE = REPO / "examples" / "inventory.yaml"

# What each command needs besides the file to get as far as reading it.
MISSING_FILE: dict[str, list[str]] = {
    "exporter": ["--once", "--inventory", MISSING],
    "serve": ["m1", "--inventory", MISSING],
    "check-config": [MISSING],
    "doctor": ["--inventory", MISSING],
    "render": [
        "all",
        "--inventory",
        MISSING,
        "--out",
        "/nonexistent-mlx-medic-test/out",
        "--remediator.url",
        "http://127.0.0.1:1",
        "--alertmanager.address",
        "127.0.0.1:2",
    ],
    "remediator": ["--config.file", MISSING],
    "backend": ["m1", "--inventory", MISSING],
    "log": ["--config.file", MISSING],
    "remediate": ["m1", "--config.file", MISSING],
    "pause": ["--config.file", MISSING],
    "resume": ["--config.file", MISSING],
    "journal": ["prune", "--config.file", MISSING],
    "drain": ["n1", "--config.file", MISSING],
    "undrain": ["n1", "--config.file", MISSING],
    # the probe reads no file: its --lock-dir under a regular file is the one it cannot use
    "probe": ["--host", "127.0.0.1", "--port", "9", "--lock-dir", "/etc/hostname/locks"],
    "node": ["ledger", "--inventory", MISSING],
}
HELPER_MISSING_FILE: dict[str, list[str]] = {
    "ledger": [],
    "sweep": ["m1"],
    "clean": ["m1"],
    "orphans": [],
    "service": ["m1", "status"],
    "run": ["m1", "show"],
    "backend": ["m1", "show"],
    "lock": ["m1", "show"],
    "pid-alive": ["1"],
    "facts": [],
    "probe": ["m1"],
    "forced-command": [],
}


def mlx_medic(
    *args: str, prefix: tuple[str, ...] = (), timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLX_MEDIC_CONFIG", None)  # the on-call commands must not find a config here
    return subprocess.run(
        [*prefix, sys.executable, "-m", "mlx_medic.cli", *args],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess[str], prefix: str) -> str:
    """The single line a failure says; fails the test on a traceback or several lines."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


# --- every command and helper: --help, --version, a bad flag ------------------------------

EVERY_COMMAND = [[name] for name in COMMANDS] + [["node", name] for name in HELPERS]
IDS = [" ".join(argv) for argv in EVERY_COMMAND]


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=IDS)
def test_help_exits_0_with_usage_on_stdout(command: list[str]) -> None:
    result = mlx_medic(*command, "--help")
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stdout.startswith(f"usage: mlx-medic {' '.join(command)}"), result.stdout
    assert "--version" in result.stdout


@pytest.mark.parametrize("command", [[], *EVERY_COMMAND], ids=["mlx-medic", *IDS])
def test_version_exits_0_with_the_installed_version(command: list[str]) -> None:
    result = mlx_medic(*command, "--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"mlx-medic {VERSION}\n", "")


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=IDS)
def test_a_bad_flag_is_one_line_naming_it_and_the_commands_help_exit_2(
    command: list[str],
) -> None:
    name = " ".join(command)
    result = mlx_medic(*command, "--no-such-flag")
    assert result.returncode == EXIT_USAGE
    line = one_line_error(result, f"mlx-medic {name}")
    assert "--no-such-flag" in line or "required" in line, line
    assert f"(see mlx-medic {name} --help)" in line


# --- a missing file -----------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(MISSING_FILE), ids=sorted(MISSING_FILE))
def test_a_missing_file_is_one_line_naming_it_exit_2(command: str) -> None:
    argv = MISSING_FILE[command]
    result = mlx_medic(command, *argv)
    assert result.returncode == EXIT_USAGE, result.stderr
    named = "/etc/hostname" if command == "probe" else MISSING
    prefix = f"mlx-medic {command} {argv[0]}" if command == "node" else f"mlx-medic {command}"
    assert named in one_line_error(result, prefix)


@pytest.mark.parametrize("helper", sorted(HELPER_MISSING_FILE))
def test_every_node_helper_says_a_missing_inventory_in_one_line_exit_2(helper: str) -> None:
    result = mlx_medic("node", helper, *HELPER_MISSING_FILE[helper], "--inventory", MISSING)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert MISSING in one_line_error(result, f"mlx-medic node {helper}: ")


def test_a_node_helper_that_cannot_tell_which_node_it_is_on_says_so_exit_2(
    tmp_path: Path,
) -> None:
    """The same mistake, the same code: the exporter without a node name exits 2 too."""
    inventory = tmp_path / "inventory.yaml"
    listener_argv("remediator", tmp_path)  # writes inventory.yaml (node n1) beside it
    for argv in (["node", "ledger"], ["exporter", "--once"]):
        result = mlx_medic(*argv, "--inventory", str(inventory))
        assert result.returncode == EXIT_USAGE, (argv, result.stderr)
        assert "--node NAME" in result.stderr.splitlines()[-1], result.stderr


def test_a_log_file_that_cannot_be_opened_is_one_line_exit_2() -> None:
    result = mlx_medic("exporter", "--once", "--log.file", "/nonexistent-mlx-medic-test/x.log")
    assert result.returncode == EXIT_USAGE
    line = one_line_error(result, "mlx-medic exporter: --log.file ")
    assert "/nonexistent-mlx-medic-test/x.log" in line


# --- a port taken, a port refused -----------------------------------------------------------


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port this test listens on, so the command under test finds it taken."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def listener_argv(command: str, where: Path) -> list[str]:
    """What the exporter and the remediator need to get as far as listening."""
    if command == "exporter":
        return ["exporter", "--state-dir", str(where / "state")]
    inventory = where / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(where / "state"),
                "nodes": {"n1": {"ssh": "127.0.0.1", "user": "medic"}},
                "models": {
                    "m1": {
                        "model": "tiny",
                        "nodes": ["n1"],
                        "port": 18080,
                        "service": {"manager": "supervisord", "label": "m1"},
                        "backends": {"ring": {"hostfile": str(where / "m1.json")}},
                    }
                },
            }
        )
    )
    token = where / "token"
    token.write_text("contract-test-token\n")
    token.chmod(0o600)
    config = where / "remediator.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "inventory": str(inventory),
                "journal": str(where / "journal.sqlite"),
                "auth": {"bearer_token_file": str(token)},
            }
        )
    )
    return ["remediator", "--config.file", str(config)]


@pytest.mark.parametrize("command", ["exporter", "remediator"])
def test_a_taken_listen_address_is_one_line_exit_3(
    command: str, held_port: int, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{held_port}"
    argv = listener_argv(command, tmp_path)
    result = mlx_medic(*argv, "--web.listen-address", address)
    assert result.returncode == EXIT_BUSY, result.stderr
    line = one_line_error(result, f"mlx-medic {command}: cannot listen on {address}: ")
    assert "another process listens there" in line and "--web.listen-address" in line


@pytest.mark.parametrize("command", ["exporter", "remediator"])
def test_a_port_this_user_may_not_bind_is_one_line_exit_2(command: str, tmp_path: Path) -> None:
    setpriv = require_tool("setpriv")
    address = "127.0.0.1:1023"  # below ip_unprivileged_port_start (1024)
    argv = listener_argv(command, tmp_path)
    without = (setpriv, "--bounding-set", "-net_bind_service", "--")
    result = mlx_medic(*argv, "--web.listen-address", address, prefix=without)
    assert result.returncode == EXIT_USAGE, result.stderr
    line = one_line_error(result, f"mlx-medic {command}: cannot listen on {address}: ")
    assert "may not bind that port" in line


# --- one meaning per flag -------------------------------------------------------------------


def test_config_file_for_the_inventory_still_works_and_says_to_use_inventory() -> None:
    result = mlx_medic("exporter", "--once", "--config.file", MISSING)
    assert result.returncode == EXIT_USAGE
    warning, error = result.stderr.splitlines()
    assert warning == (
        "mlx-medic exporter: warning: --config.file is deprecated here; use --inventory FILE"
        " (--config.file is the remediator's own config)"
    )
    assert error.startswith(f"mlx-medic exporter: {MISSING}")


# doctor takes both: --config.file is its every-node view (tests/doctor/test_cluster.py)
@pytest.mark.parametrize("command", ["exporter", "serve", "backend", "render", "node"])
def test_the_inventory_is_named_by_inventory_in_every_commands_help(command: str) -> None:
    argv = [command, "ledger"] if command == "node" else [command]
    text = mlx_medic(*argv, "--help").stdout
    usage = text.split("\n\n")[0]
    assert "--inventory FILE" in usage
    assert "--config.file" not in usage  # the deprecated alias is hidden


@pytest.mark.parametrize(
    "command", ["remediator", "log", "remediate", "pause", "resume", "journal"]
)
def test_config_file_names_the_remediators_own_config(command: str) -> None:
    text = mlx_medic(command, "--help").stdout
    assert "--config.file" in text and "--inventory" not in text


# --- logs: one format flag for every long-running command ----------------------------------


@pytest.mark.parametrize("command", ["exporter", "remediator", "serve"])
def test_every_long_running_command_takes_log_format_text_or_json_default_text(
    command: str,
) -> None:
    text = mlx_medic(command, "--help").stdout
    assert "--log.format {text,json}" in text and "--log.file FILE" in text
    result = mlx_medic(command, "--log.format", "xml")
    assert result.returncode == EXIT_USAGE
    assert "invalid choice: 'xml'" in one_line_error(result, f"mlx-medic {command}: error:")


@pytest.mark.parametrize("command", ["exporter", "remediator", "serve"])
def test_every_long_running_command_takes_a_log_level_default_info(command: str) -> None:
    assert "--log.level {debug,info,warning,error}" in mlx_medic(command, "--help").stdout


def test_the_exporter_logs_only_warnings_and_worse_at_log_level_warning(tmp_path: Path) -> None:
    argv = ["exporter", "--once", "--state-dir", str(tmp_path / "state")]
    quiet = mlx_medic(*argv, "--log.level", "warning")
    assert quiet.returncode == 0
    assert " INFO " not in quiet.stderr


@pytest.mark.parametrize(
    ("level", "ssh_library"),
    [("info", "WARNING"), ("warning", "WARNING"), ("error", "ERROR"), ("debug", "DEBUG")],
)
def test_the_ssh_librarys_line_per_connection_shows_only_at_log_level_debug(
    level: str, ssh_library: str
) -> None:
    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        setup_logging("text", None, level)
        assert logging.getLevelName(root.level) == level.upper()
        assert logging.getLevelName(logging.getLogger("asyncssh").level) == ssh_library
    finally:
        root.handlers[:], _ = kept
        root.setLevel(kept[1])
        logging.getLogger("asyncssh").setLevel(logging.NOTSET)


def test_the_exporter_logs_json_lines_when_asked(tmp_path: Path) -> None:
    argv = ["exporter", "--once", "--state-dir", str(tmp_path / "state")]
    text_run = mlx_medic(*argv)
    json_run = mlx_medic(*argv, "--log.format", "json")
    assert text_run.returncode == json_run.returncode == 0
    assert " INFO mlx_medic.exporter: " in text_run.stderr
    lines = [yaml.safe_load(line) for line in json_run.stderr.splitlines()]
    assert lines and all(line["level"] in ("info", "warning") for line in lines), lines


def test_output_to_a_reader_that_went_away_ends_quietly() -> None:
    """`mlx-medic check-config FILE | head -1`: no traceback when the pipe closes."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        result = subprocess.run(
            [sys.executable, "-m", "mlx_medic.cli", "check-config", str(EXAMPLE)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 1 and result.stderr == ""
