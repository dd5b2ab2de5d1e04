"""launchd jobs rendered from the inventory: what launchd reads (plistlib, and `plutil
-lint` on a Mac), one exporter per node, the serve wrapper per model as the inventory
describes its service, and the remediator."""

from __future__ import annotations

import plistlib
import shutil
from pathlib import Path

import pytest

from mlx_medic.cli import parse_args
from mlx_medic.command_line import EXIT_USAGE
from mlx_medic.inventory.load import load_inventory
from tests.render.helpers import (
    ALL_FLAGS,
    ALL_SSH,
    EXAMPLE,
    model,
    render,
    render_example,
    run,
    write_inventory,
)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render_example("launchd", tmp_path_factory.mktemp("launchd")) / "launchd"


def load(path: Path) -> dict:
    with path.open("rb") as handle:
        return plistlib.load(handle)


def test_every_rendered_plist_is_read_by_plistlib_and_by_plutil_where_present(out: Path):
    plists = sorted(out.rglob("*.plist"))
    assert len(plists) == 5 + 2 + 1  # five exporters, two models, the remediator
    for path in plists:
        assert load(path)["Label"]
    plutil = shutil.which("plutil")  # macOS only
    if plutil:
        result = run(plutil, "-lint", *map(str, plists))
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_node_gets_an_exporter_that_names_its_node_and_reads_the_inventory_there(
    out: Path,
):
    inventory = load_inventory(EXAMPLE)
    for node in inventory.nodes:
        job = load(out / node.name / "com.mlx-medic.exporter.plist")
        argv = job["ProgramArguments"]
        assert argv[0] == node.medic_command
        args = parse_args(argv[1:])
        assert (args.command, args.node, args.inventory) == (
            "exporter",
            node.name,
            node.medic_config,
        )
        assert args.listen == f"{node.ssh}:10900"  # the address Prometheus scrapes
        assert job["KeepAlive"] is True and job["RunAtLoad"] is True
        # its log written by itself, reopened after a rotation; launchd's file apart
        assert args.log_file == Path("/var/log/mlx-medic-exporter.log")
        assert job["StandardErrorPath"] == "/var/log/mlx-medic-exporter.stderr.log"


def test_a_wrapper_model_runs_mlx_medic_serve_on_its_head_as_its_service_says(out: Path):
    inventory = load_inventory(EXAMPLE)
    for m in inventory.models:
        head = inventory.node(m.head)
        job = load(out / m.head / m.service.plist_path.name)
        assert job["Label"] == m.service.label
        assert job["ProgramArguments"] == [
            head.medic_command,
            "serve",
            m.name,
            "--inventory",
            str(head.medic_config),
        ]
        assert job["UserName"] == m.service.user
        assert job["KeepAlive"] is True and job["ThrottleInterval"] == 10
        assert job["EnvironmentVariables"] == {
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(m.tmp_dirs[0]),
        }
        assert job["ExitTimeOut"] > m.policy.stop_timeout
        logs = [str(p) for p in m.log_files]
        assert job["StandardErrorPath"] == logs[0]
        assert job["StandardOutPath"] == logs[-1]  # the second, or the only one


def test_the_remediator_job_runs_a_command_the_cli_accepts_as_its_own_user(out: Path):
    job = load(out / "com.mlx-medic.remediator.plist")
    args = parse_args(job["ProgramArguments"][1:])
    assert args.command == "remediator" and args.config_file is None  # MLX_MEDIC_CONFIG says
    assert job["EnvironmentVariables"]["MLX_MEDIC_CONFIG"] == "/etc/mlx-medic/remediator.yml"
    assert job["UserName"] == "mlx-medic" and job["ExitTimeOut"] == 60
    state_dir = Path("/var/lib/mlx-medic-remediator")
    assert args.log_file == state_dir / "remediator.log"
    assert job["StandardErrorPath"] == str(state_dir / "remediator.stderr.log")


def test_a_script_service_gets_no_job_since_it_is_the_sites_own(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/mlx-medic/bin/mlx-medic"}},
        {
            "m1": model(
                "launchd",
                "com.x.m1",
                service={"manager": "launchd", "label": "com.x.m1", "kind": "script"},
            )
        },
    )
    code, _, err = render("launchd", inventory, tmp_path / "out")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out").rglob("*.plist")) == [
        "com.mlx-medic.exporter.plist",
        "com.mlx-medic.remediator.plist",
    ]


def test_a_stop_timeout_from_the_inventory_sets_the_exit_timeout_above_it(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/mlx-medic/bin/mlx-medic"}},
        {"m1": model("launchd", "com.x.m1", policy={"stop_timeout": "5m"})},
    )
    render("launchd", inventory, tmp_path / "out")
    job = load(tmp_path / "out" / "launchd" / "n1" / "com.x.m1.plist")
    assert job["ExitTimeOut"] > 300


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"log_files": []}, "models.m1.log_files: empty"),
        ({"tmp_dirs": []}, "models.m1.tmp_dirs: empty"),
    ],
)
def test_a_missing_field_a_job_needs_is_an_error_naming_it_and_nothing_is_written(
    tmp_path: Path, change: dict, message: str
):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/mlx-medic/bin/mlx-medic"}},
        {"m1": model("launchd", "com.x.m1", **change)},
        ssh=ALL_SSH,
    )
    code, _, err = render("all", inventory, tmp_path / "out", *ALL_FLAGS)
    assert code == EXIT_USAGE and message in err
    assert not (tmp_path / "out").exists()


def test_a_label_with_a_double_hyphen_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path,
):
    """The plist's comment quotes the label, and an XML comment cannot hold `--`."""
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/mlx-medic/bin/mlx-medic"}},
        {"m1": model("launchd", "com.x.m1--b")},
    )
    code, _, err = render("launchd", inventory, tmp_path / "out")
    assert code == EXIT_USAGE
    assert "models.m1.service.label: 'com.x.m1--b' holds '--'" in err
    assert not (tmp_path / "out").exists()


def test_a_medic_command_that_is_no_absolute_path_is_refused(tmp_path: Path):
    inventory = write_inventory(tmp_path / "inv.yaml", {"n1": {"ssh": "127.0.0.2"}}, {})
    code, _, err = render("launchd", inventory, tmp_path / "out")
    assert code == EXIT_USAGE
    assert "nodes.n1.medic_command: 'mlx-medic' is not an absolute path" in err
