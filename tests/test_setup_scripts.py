"""The set-up scripts: scripts/run-exporter.sh sets up only when .venv is not current (a fresh
clone, or pyproject.toml or scripts/setup.sh changed since the last install), and
scripts/setup.sh stamps what it installed and checks its mode before it installs anything.

Every test runs the real scripts in a temporary checkout whose installers are fakes that
record their calls in the file `calls`: nothing is installed, no network, no root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# Stands in for scripts/setup.sh under scripts/run-exporter.sh: makes the venv's mlx-medic
# (which prints its arguments) and stamps a base install, as the real one does.
FAKE_SETUP = """#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/.."
echo "setup $*" >> calls
mkdir -p .venv/bin
printf '#!/bin/sh\\necho "mlx-medic $*"\\n' > .venv/bin/mlx-medic
chmod +x .venv/bin/mlx-medic
. scripts/venv-stamp.sh
venv_write_stamp base
"""
# Stands in for .venv/bin/python under the real scripts/setup.sh: records pip's arguments.
FAKE_PYTHON = '#!/bin/sh\necho "python $*" >> calls\nexit "${FAKE_PIP_RC:-0}"\n'
# Stands in for apt-get: no test may reach it.
FAKE_APT_GET = '#!/bin/sh\necho "apt-get $*" >> calls\nexit 1\n'


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


class Checkout:
    """A temporary repository root with the real scripts/venv-stamp.sh and the scripts a
    test names, real or fake."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.copy(SCRIPTS / "venv-stamp.sh", root / "scripts" / "venv-stamp.sh")
        (root / "pyproject.toml").write_text('[project]\nname = "mlx-medic"\n')
        executable(root / "bin" / "apt-get", FAKE_APT_GET)

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        path = f"{self.root / 'bin'}{os.pathsep}{os.environ['PATH']}"
        return subprocess.run(
            ["bash", str(self.root / "scripts" / script), *args],
            cwd=self.root,
            env={**os.environ, "PATH": path, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )

    def calls(self) -> list[str]:
        calls = self.root / "calls"
        return calls.read_text().splitlines() if calls.exists() else []

    def library(self, command: str) -> subprocess.CompletedProcess[str]:
        """`command` after sourcing scripts/venv-stamp.sh at the root."""
        return subprocess.run(
            ["bash", "-c", f". scripts/venv-stamp.sh && {command}"],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def stamp(self, installed: str) -> None:
        self.library(f"venv_write_stamp {installed}").check_returncode()

    def venv_current(self, wanted: str) -> bool:
        return self.library(f"venv_current {wanted}").returncode == 0

    def fake_mlx_medic(self) -> None:
        executable(self.root / ".venv" / "bin" / "mlx-medic", '#!/bin/sh\necho "mlx-medic $*"\n')


@pytest.fixture
def exporter_checkout(tmp_path: Path) -> Checkout:
    """The real scripts/run-exporter.sh beside a fake scripts/setup.sh."""
    executable(tmp_path / "scripts" / "setup.sh", FAKE_SETUP)
    executable(tmp_path / "scripts" / "run-exporter.sh", (SCRIPTS / "run-exporter.sh").read_text())
    return Checkout(tmp_path)


@pytest.fixture
def setup_checkout(tmp_path: Path) -> Checkout:
    """The real scripts/setup.sh with a venv whose python is a fake."""
    executable(tmp_path / "scripts" / "setup.sh", (SCRIPTS / "setup.sh").read_text())
    checkout = Checkout(tmp_path)
    executable(tmp_path / ".venv" / "bin" / "python", FAKE_PYTHON)
    checkout.fake_mlx_medic()
    return checkout


def start_exporter(checkout: Checkout) -> None:
    """scripts/run-exporter.sh execs the venv's mlx-medic exporter with its arguments."""
    started = checkout.run("run-exporter.sh", "--web.listen-address", "127.0.0.1:10999")
    assert started.returncode == 0, started.stderr
    assert started.stdout == "mlx-medic exporter --web.listen-address 127.0.0.1:10999\n"


def test_a_fresh_clone_is_set_up_before_the_exporter_starts(exporter_checkout: Checkout) -> None:
    start_exporter(exporter_checkout)
    assert exporter_checkout.calls() == ["setup "]


def test_a_current_venv_starts_the_exporter_without_setting_up(
    exporter_checkout: Checkout,
) -> None:
    start_exporter(exporter_checkout)
    start_exporter(exporter_checkout)
    assert exporter_checkout.calls() == ["setup "]


def test_a_changed_pyproject_sets_up_again(exporter_checkout: Checkout) -> None:
    start_exporter(exporter_checkout)
    with (exporter_checkout.root / "pyproject.toml").open("a") as pyproject:
        pyproject.write('dependencies = ["psutil>=6"]\n')
    start_exporter(exporter_checkout)
    start_exporter(exporter_checkout)
    assert exporter_checkout.calls() == ["setup ", "setup "]


def test_a_changed_setup_script_sets_up_again(exporter_checkout: Checkout) -> None:
    start_exporter(exporter_checkout)
    with (exporter_checkout.root / "scripts" / "setup.sh").open("a") as setup:
        setup.write("# installs one more thing\n")
    start_exporter(exporter_checkout)
    assert exporter_checkout.calls() == ["setup ", "setup "]


def test_a_test_install_covers_the_exporter(exporter_checkout: Checkout) -> None:
    exporter_checkout.fake_mlx_medic()
    exporter_checkout.stamp("test")
    start_exporter(exporter_checkout)
    assert exporter_checkout.calls() == []


def test_a_base_install_does_not_cover_the_tests(exporter_checkout: Checkout) -> None:
    exporter_checkout.fake_mlx_medic()
    exporter_checkout.stamp("base")
    assert exporter_checkout.venv_current("base")
    assert not exporter_checkout.venv_current("test")


def test_a_stamp_without_mlx_medic_in_the_venv_sets_up_again(exporter_checkout: Checkout) -> None:
    (exporter_checkout.root / ".venv").mkdir()
    exporter_checkout.stamp("base")
    start_exporter(exporter_checkout)
    assert exporter_checkout.calls() == ["setup "]


def test_a_garbled_stamp_sets_up_again(exporter_checkout: Checkout) -> None:
    exporter_checkout.fake_mlx_medic()
    (exporter_checkout.root / ".venv" / "mlx-medic-setup.stamp").write_text("\n")
    start_exporter(exporter_checkout)
    assert exporter_checkout.calls() == ["setup "]


def test_setup_installs_the_package_and_stamps_a_base_install(setup_checkout: Checkout) -> None:
    done = setup_checkout.run("setup.sh")
    assert done.returncode == 0, done.stderr
    assert setup_checkout.calls() == [
        "python -m pip install -q --upgrade pip",
        "python -m pip install -q -e .",
    ]
    assert setup_checkout.venv_current("base")
    assert not setup_checkout.venv_current("test")


def test_setup_test_python_installs_the_test_extras_without_apt_get(
    setup_checkout: Checkout,
) -> None:
    done = setup_checkout.run("setup.sh", "--test-python")
    assert done.returncode == 0, done.stderr
    assert setup_checkout.calls() == [
        "python -m pip install -q --upgrade pip",
        "python -m pip install -q -e .[test]",
    ]
    assert setup_checkout.venv_current("test")


def test_an_install_that_fails_leaves_the_venv_stale(setup_checkout: Checkout) -> None:
    setup_checkout.stamp("base")
    done = setup_checkout.run("setup.sh", FAKE_PIP_RC="1")
    assert done.returncode != 0
    assert not setup_checkout.venv_current("base")


def test_setup_help_names_every_mode_and_installs_nothing(setup_checkout: Checkout) -> None:
    done = setup_checkout.run("setup.sh", "--help")
    assert done.returncode == 0
    for mode in ("scripts/setup.sh  ", "--test-python", "--test ", "--help"):
        assert mode in done.stdout
    assert setup_checkout.calls() == []


@pytest.mark.parametrize("args", [["--bogus"], ["--test", "--test-python"], ["test"]])
def test_an_unknown_argument_is_refused_naming_the_modes(
    setup_checkout: Checkout, args: list[str]
) -> None:
    done = setup_checkout.run("setup.sh", *args)
    assert done.returncode == 2
    assert f"setup: '{' '.join(args)}' is not a mode" in done.stderr
    assert "expected no argument, --test-python or --test" in done.stderr
    assert setup_checkout.calls() == []
