"""The `mlx-medic` command imports only the command it runs: a probe runs on a node (over
SSH on every re-check, as `node probe`) and must start fast; nothing a node runs pays for
the remediator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testbed import free_port

SERVICE_STACK = (
    "aiohttp",
    "asyncssh",
    "mlx_medic.remediator.engine",
    "mlx_medic.remediator.webapp",
    "mlx_medic.remediator",
)


def modules_loaded_by(*argv: str) -> tuple[int, set[str]]:
    code = (
        "import sys\n"
        "from mlx_medic.cli import main\n"
        "try:\n"
        f"    code = main({list(argv)!r})\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        f"print('LOADED', *sorted(m for m in {SERVICE_STACK!r} if m in sys.modules),"
        " file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    line = next(line for line in result.stderr.splitlines() if line.startswith("LOADED"))
    return result.returncode, set(line.split()[1:])


def test_probe_loads_neither_the_web_stack_nor_ssh_nor_the_engine() -> None:
    code, loaded = modules_loaded_by("probe", "--host", "127.0.0.1", "--port", str(free_port()))
    assert code == 1  # nothing listens there: down
    assert loaded == set()


def test_top_level_help_lists_every_command_without_importing_any() -> None:
    code, loaded = modules_loaded_by("--help")
    assert code == 0 and loaded == set()


def test_the_remediator_command_loads_the_service_stack_only_when_asked_for() -> None:
    code, loaded = modules_loaded_by("remediator", "--help")
    assert code == 0 and {"aiohttp", "mlx_medic.remediator"} <= loaded


def test_a_node_helper_loads_neither_the_web_stack_nor_ssh_nor_the_engine(
    tmp_path: Path,
) -> None:
    code, loaded = modules_loaded_by(
        "node", "ledger", "--json", "--node", "n1", "--state-dir", str(tmp_path)
    )
    assert code == 0
    assert loaded == set()


def test_the_forced_command_loads_neither_the_web_stack_nor_ssh_nor_the_engine(
    tmp_path: Path,
) -> None:
    config = tmp_path / "inventory.yaml"
    config.write_text("nodes:\n  n1: {ssh: 127.0.0.1}\n")
    code, loaded = modules_loaded_by("node", "forced-command", "--inventory", str(config))
    assert code == 2  # no SSH_ORIGINAL_COMMAND in this environment: refused
    assert loaded == set()
