"""`mlx-medic render`: its help says what --inventory names and which flags each target
requires; every missing setting is named at once, before anything is written; each
start-up failure is one line with its exit code; it loads nothing of the deployables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlx_medic.command_line import EXIT_FAILED, EXIT_USAGE
from mlx_medic.exporter.main import DEFAULT_LISTEN
from mlx_medic.render import services
from mlx_medic.render.cli import REQUIRED, TARGETS
from tests.render.helpers import (
    ALL_FLAGS,
    ALL_SSH,
    EXAMPLE,
    EXAMPLE_KEY,
    SITE_FLAGS,
    model,
    render,
    write_inventory,
)
from tests.test_cli_dispatch import modules_loaded_by


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_help_says_what_the_inventory_is_and_marks_each_required_flag_from_one_table():
    result = cli("render", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--inventory names the one file that says what runs where" in text
    for target in (*TARGETS, "all"):
        assert target in text
    for required in REQUIRED.values():
        flag = required.flag.split()[0]
        help_text = text.split(f"{required.flag} ", 1)[1].split(" --", 1)[0]
        assert required.note() in help_text, flag
    assert "(required) " in text and "(required for prometheus, alertmanager)" in text


def test_every_missing_setting_is_named_at_once_with_what_needs_it_and_nothing_is_written():
    result = cli("render", "all")
    assert result.returncode == EXIT_USAGE
    assert result.stderr == (
        "mlx-medic render: missing settings: --inventory FILE; --out DIR;"
        " --remediator.url URL (for prometheus, alertmanager);"
        " --alertmanager.address HOST:PORT (for prometheus)\n"
    )


def test_only_what_the_chosen_target_needs_is_asked_for(tmp_path: Path):
    code, _, err = render("alertmanager", EXAMPLE, tmp_path / "out")
    assert code == EXIT_USAGE
    assert err == ("mlx-medic render: missing settings: --remediator.url URL (for alertmanager)\n")
    assert not (tmp_path / "out").exists()


def test_the_keys_and_addresses_authorized_keys_reads_are_listed_with_the_flags(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/m/bin/mlx-medic"}},
        {},
    )
    code, _, err = render(
        "all", inventory, tmp_path / "out", "--ssh.public-key", str(tmp_path / "none.pub")
    )
    assert code == EXIT_USAGE
    assert err.startswith("mlx-medic render: missing settings: --remediator.url URL")
    assert (
        f"--ssh.public-key FILE (for authorized-keys: {tmp_path / 'none.pub'} cannot be"
        " read: No such file or directory)" in err
    )
    assert "ssh.remediator_addresses in the inventory (for authorized-keys: " in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_all_writes_nothing_when_one_target_cannot_render(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/m/bin/mlx-medic"}},
        {"m1": model("launchd", "com.x.m1", tmp_dirs=[])},
        ssh=ALL_SSH,
    )
    code, _, err = render("all", inventory, tmp_path / "out", *ALL_FLAGS)
    assert code == EXIT_USAGE
    assert err == (
        "mlx-medic render: launchd: models.m1.tmp_dirs: empty; the service's TMPDIR is the"
        " first of them\n"
    )
    assert not (tmp_path / "out").exists()


def test_all_lists_every_file_it_wrote(tmp_path: Path):
    code, out, err = render(
        "all", EXAMPLE, tmp_path / "out", *SITE_FLAGS, "--ssh.public-key", str(EXAMPLE_KEY)
    )
    assert code == 0, err
    listed = {Path(line) for line in out.splitlines()}
    assert listed == {p for p in (tmp_path / "out").rglob("*") if p.is_file()}


def test_the_deprecated_config_file_still_names_the_inventory_with_a_warning(tmp_path: Path):
    result = cli("render", "rules", "--config.file", str(EXAMPLE), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "--config.file is deprecated here; use --inventory FILE" in result.stderr
    assert (tmp_path / "rules" / "mlx-medic.rules.yaml").is_file()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("nodes:\n  n1: {ssh: 127.0.0.2, port: 0}\n", "line 2"),
        (None, "inv.yaml"),  # no such file
    ],
)
def test_an_inventory_that_cannot_be_used_is_a_usage_error_naming_it(
    tmp_path: Path, text: str | None, said: str
):
    bad = tmp_path / "inv.yaml"
    if text is not None:
        bad.write_text(text)
    code, _, err = render("launchd", bad, tmp_path / "out")
    assert code == EXIT_USAGE and said in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_render_loads_neither_the_web_stack_nor_ssh_nor_the_engine(tmp_path: Path):
    code, loaded = modules_loaded_by(
        "render",
        "all",
        "--inventory",
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


def test_an_out_dir_that_cannot_be_written_is_a_failure_in_one_line(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = render("rules", EXAMPLE, blocker / "out")
    assert code == EXIT_FAILED
    assert err.startswith("mlx-medic render: cannot write") and len(err.splitlines()) == 1
