"""`mlx-medic render`: its help says which file --config.file names and why, every target
renders before anything is written, and it loads nothing of the deployables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlx_medic.exporter.main import DEFAULT_LISTEN
from mlx_medic.render import services
from tests.render.helpers import EXAMPLE, EXAMPLE_KEY, SITE_FLAGS, render
from tests.test_cli_dispatch import modules_loaded_by


def test_the_help_says_config_file_is_the_inventory_and_why():
    result = subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "render", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--config.file names the INVENTORY, not the remediator's config" in text
    for target in (
        "launchd",
        "systemd",
        "supervisord",
        "sudoers",
        "authorized-keys",
        "newsyslog",
        "prometheus",
        "alertmanager",
        "rules",
        "all",
    ):
        assert target in text


def test_all_writes_nothing_when_one_target_cannot_render(tmp_path: Path):
    code, _, err = render("all", EXAMPLE, tmp_path / "out", "--ssh.public-key", str(EXAMPLE_KEY))
    assert code == 1 and "needs --remediator.url" in err
    assert not (tmp_path / "out").exists()


def test_all_lists_every_file_it_wrote(tmp_path: Path):
    code, out, err = render(
        "all", EXAMPLE, tmp_path / "out", *SITE_FLAGS, "--ssh.public-key", str(EXAMPLE_KEY)
    )
    assert code == 0, err
    listed = {Path(line) for line in out.splitlines()}
    assert listed == {p for p in (tmp_path / "out").rglob("*") if p.is_file()}


def test_a_broken_inventory_is_reported_with_its_line(tmp_path: Path):
    bad = tmp_path / "inv.yaml"
    bad.write_text("nodes:\n  n1: {ssh: 127.0.0.2, port: 0}\n")
    code, _, err = render("launchd", bad, tmp_path / "out")
    assert code == 1 and "line 2" in err


def test_render_loads_neither_the_web_stack_nor_ssh_nor_the_engine(tmp_path: Path):
    code, loaded = modules_loaded_by(
        "render",
        "all",
        "--config.file",
        str(EXAMPLE),
        "--out",
        str(tmp_path),
        *SITE_FLAGS,
        "--ssh.public-key",
        str(EXAMPLE_KEY),
    )
    assert code == 0 and loaded == set()


def test_the_rendered_exporter_port_is_the_exporters_default():
    assert DEFAULT_LISTEN.endswith(f":{services.EXPORTER_PORT}")


def test_an_out_dir_that_cannot_be_made_is_reported_without_a_traceback(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = render("rules", EXAMPLE, blocker / "out")
    assert code == 1 and "cannot write" in err and "Traceback" not in err
