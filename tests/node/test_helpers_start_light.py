"""Each node helper imports only what it needs: the remediator runs one over SSH on every
step of every run, so none loads the web stack, SSH, the engine or the exporter, and once
the inventory is validated and snapshotted, none loads pydantic or yaml either."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.node.helper_runner import two_model_helpers

HEAVY = (
    "aiohttp",
    "asyncssh",
    "mlx_medic.remediator",
    "mlx_medic.exporter",
    "prometheus_client",
    "pydantic",
    "yaml",
    # The stdlib's heavier corners: CPU at each of the remediator's helper starts.
    "hashlib",  # OpenSSL's libcrypto (mlx_medic.digests)
    "http.client",  # and ssl (the probe speaks HTTP on its socket)
    "logging.handlers",  # socket, pickle, queue (only with --log.file)
    "logging",  # set up when a helper first logs (mlx_medic.log_on_use)
    "shutil",  # argparse's formatter's terminal width, with zlib, bz2 and lzma
    "importlib.metadata",  # email, zipfile, csv: facts reads dist-info dir names
    "platform",  # facts reads os.uname() and sys.version_info
)


def loaded_by(argv: list[str], env: dict[str, str]) -> list[str]:
    """Run `mlx-medic ARGV` in a fresh interpreter: the heavy modules it loaded."""
    code = (
        "import sys\nfrom mlx_medic.cli import main\n"
        f"status = main({argv!r})\n"
        f"print('LOADED', *sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
        "sys.exit(status)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("LOADED"))
    return line.split()[1:]


@pytest.mark.parametrize(
    ("args", "needs"),
    [
        (("service", "m1", "status"), []),
        (("run", "m1", "show"), []),
        (("backend", "m1", "show"), []),
        (("lock", "m1", "show"), []),
        (("pid-alive", "1"), []),
        (("facts", "m1"), []),
        (("orphans", "m1"), []),
        (("sweep", "m1", "--dry-run"), []),
        (("probe", "m1", "--timeout", "1"), []),  # nothing listens: down, its verdict
    ],
)
def test_a_helper_loads_no_service_stack_ssh_exporter_or_validator(
    tmp_path: Path, args: tuple[str, ...], needs: list[str]
) -> None:
    helpers = two_model_helpers(tmp_path)
    argv = ["node", *args, "--inventory", str(helpers.config), "--node", "n1", "--json"]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = loaded_by(argv, env)  # validates the inventory and snapshots it
    # hashlib, shutil, logging, importlib.metadata, platform: pydantic's own imports
    assert set(first) <= {
        "pydantic",
        "yaml",
        "hashlib",
        "shutil",
        "logging",
        "importlib.metadata",
        "platform",
    }, first
    assert loaded_by(argv, env) == needs


def test_a_helper_reads_a_validated_inventory_without_pydantic(tmp_path: Path) -> None:
    """The first helper validates the file and snapshots it; the next reads the snapshot."""
    helpers = two_model_helpers(tmp_path)
    argv = [
        "node",
        "sweep",
        "m1",
        "--dry-run",
        "--inventory",
        str(helpers.config),
        "--node",
        "n1",
        "--json",
    ]
    code = (
        "import sys\nfrom mlx_medic.cli import main\n"
        f"status = main({argv!r})\n"
        "print('LOADED', *sorted(m for m in ('pydantic', 'yaml') if m in sys.modules),"
        " file=sys.stderr)\n"
        "sys.exit(status)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    loaded = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
        )
        assert result.returncode == 0, result.stderr
        loaded.append(
            next(line for line in result.stderr.splitlines() if line.startswith("LOADED")).split()[
                1:
            ]
        )
    assert loaded == [["pydantic", "yaml"], []]


REPO = Path(__file__).resolve().parents[2]
# What a node helper reads the node with: every module of state/ and processes/, and the
# inventory's plain-data side.
PLAIN = [
    *(
        f"mlx_medic.{package}.{path.stem}"
        for package in ("state", "processes")
        for path in sorted((REPO / "mlx_medic" / package).glob("*.py"))
        if path.stem != "__init__"
    ),
    "mlx_medic.inventory.snapshot",
    "mlx_medic.inventory.methods",
    "mlx_medic.inventory.names",
]


def test_the_state_process_and_snapshot_modules_load_no_validator() -> None:
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n    importlib.import_module(name)\n"
        "print('LOADED', *sorted(m for m in ('pydantic', 'yaml') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *PLAIN], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert len(PLAIN) > 10 and result.stdout.split() == ["LOADED"]


def test_a_helper_that_logs_sets_logging_up_then_as_every_command_does(tmp_path: Path) -> None:
    """Logging comes with the first line logged, in the format of every command's stderr:
    `node clean` says how it walks the tmp dirs."""
    helpers = two_model_helpers(tmp_path)
    argv = ["node", "clean", "m1", "--dry-run", "--inventory", str(helpers.config)]
    code = (
        f"import sys\nfrom mlx_medic.cli import main\nsys.exit(main({[*argv, '--node', 'n1']!r}))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"^\d{4}-\d\d-\d\d [\d:,]+ INFO mlx_medic.platform: tmp walk", result.stderr, re.M
    ), result.stderr
