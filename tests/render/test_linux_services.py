"""systemd units and supervisord programs for Linux heads, checked by the real tools:
`systemd-analyze verify` (with every ExecStart binary present) and supervisord's own
config parser; both stop the wrapper with a bound longer than its own teardown."""

from __future__ import annotations

import configparser
import json
import os
import pwd
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.command_line import EXIT_USAGE
from tests.render.helpers import model, render, render_example, render_ok, run, write_inventory
from tests.tools import require_tool

SUPERVISOR_PYTHON = "/usr/bin/python3"  # Debian's supervisor lives in the system Python


@pytest.fixture
def linux(tmp_path: Path) -> tuple[Path, Path]:
    """An inventory with a systemd and a supervisord model on one head whose mlx-medic
    is a real executable (systemd-analyze checks that ExecStart exists)."""
    medic = tmp_path / "bin" / "mlx-medic"
    medic.parent.mkdir()
    medic.write_text("#!/bin/sh\nexit 0\n")
    medic.chmod(0o755)
    me = pwd.getpwuid(os.getuid()).pw_name  # supervisord checks that the user exists
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {
            "n1": {
                "ssh": "127.0.0.2",
                "medic_command": str(medic),
                "medic_config": str(tmp_path / "inv.yaml"),
            }
        },
        {
            "sysd": model(
                "systemd",
                "mlx-sysd",
                policy={"stop_timeout": "2m"},
                log_files=[str(tmp_path / "sysd.err.log"), str(tmp_path / "sysd%.out.log")],
            ),
            "sup": model(
                "supervisord",
                "mlx-sup",
                port=8081,
                service={
                    "manager": "supervisord",
                    "label": "mlx-sup",
                    "user": me,
                    "config": str(tmp_path / "supervisord.conf"),
                },
                log_files=[str(tmp_path / "sup.log")],
            ),
        },
    )
    out = render_ok("systemd", inventory, tmp_path / "out", "--remediator.command", str(medic))
    render_ok("supervisord", inventory, out)
    return out, medic


def unit(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser["Service"]


def test_systemd_analyze_verifies_every_rendered_unit(linux: tuple[Path, Path]):
    out, _ = linux
    units = sorted((out / "systemd").rglob("*.service"))
    assert sorted(u.name for u in units) == [
        "mlx-medic-exporter.service",
        "mlx-medic-remediator.service",
        "mlx-sysd.service",
    ]
    for path in units:  # one at a time: verify names the unit by its file name
        result = run(
            require_tool("systemd-analyze"), "verify", "--man=no", path.name, cwd=path.parent
        )
        assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_systemd_wrapper_unit_stops_after_the_wrappers_own_teardown(linux):
    out, medic = linux
    service = unit(out / "systemd" / "n1" / "mlx-sysd.service")
    assert int(service["TimeoutStopSec"]) > 120
    assert service["KillMode"] == "mixed"  # SIGTERM to the wrapper alone, SIGKILL to all
    assert shlex.split(service["ExecStart"]) == [
        str(medic),
        "serve",
        "sysd",
        "--inventory",
        str(out.parent / "inv.yaml"),
    ]
    assert service["User"] == "mlxsvc"
    assert service["StandardError"] == f"append:{out.parent / 'sysd.err.log'}"
    assert service["StandardOutput"] == f"append:{out.parent / 'sysd%%.out.log'}"  # %: specifier
    assert "TMPDIR=/var/tmp/mlx-share/m" in service["Environment"]


def supervisor_programs(tmp_path: Path, programs: Path) -> list[dict[str, Any]]:
    """What supervisord's own config parser makes of the rendered programs in `programs`."""
    conf = tmp_path / "supervisord.conf"
    conf.write_text(
        f"[supervisord]\nlogfile={tmp_path}/supervisord.log\npidfile={tmp_path}/sd.pid\n"
        f"[include]\nfiles = {programs}/*.conf\n"
    )
    require_tool("supervisord")
    code = (
        "import json, sys\n"
        "from supervisor.options import ServerOptions\n"
        "o = ServerOptions(); o.realize(args=['-c', sys.argv[1]])\n"
        "print(json.dumps([dict(name=p.name, command=p.command, stopwaitsecs=p.stopwaitsecs,"
        " environment=p.environment, redirect=p.redirect_stderr,"
        " killasgroup=p.killasgroup, stopasgroup=p.stopasgroup,"
        " **{f'{s}{k}': getattr(p, f'{s}_logfile{k}') for s in ('stdout', 'stderr')"
        " for k in ('', '_maxbytes', '_backups')})"
        " for g in o.process_group_configs for p in g.process_configs]))\n"
    )
    python = SUPERVISOR_PYTHON if Path(SUPERVISOR_PYTHON).exists() else sys.executable
    result = run(python, "-c", code, str(conf))
    assert result.returncode == 0, result.stdout + result.stderr
    parsed: list[dict[str, Any]] = json.loads(result.stdout)
    return parsed


def test_supervisord_parses_the_program_with_its_stop_bound(linux, tmp_path: Path):
    out, medic = linux
    (program,) = supervisor_programs(tmp_path, out / "supervisord" / "n1")
    assert program["name"] == "mlx-sup"
    assert shlex.split(program["command"]) == [
        str(medic),
        "serve",
        "sup",
        "--inventory",
        str(out.parent / "inv.yaml"),
    ]
    assert program["stopwaitsecs"] > 60  # the default policy.stop_timeout
    assert program["environment"] == {"PYTHONUNBUFFERED": "1", "TMPDIR": "/var/tmp/mlx-share/m"}
    assert program["stdout"] == str(out.parent / "sup.log") and program["redirect"]
    assert program["killasgroup"] and not program["stopasgroup"]


def test_supervisord_rotates_each_log_of_a_program_past_100_mib_keeping_7(tmp_path: Path):
    """supervisord rotates its programs' logs itself; each program says at what size and
    how many it keeps, as newsyslog does for a launchd job's logs."""
    me = pwd.getpwuid(os.getuid()).pw_name
    service = {"manager": "supervisord", "label": "mlx-two", "user": me}
    logs = [str(tmp_path / "two.err.log"), str(tmp_path / "two.out.log")]  # stderr, stdout
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/mlx-medic/bin/mlx-medic"}},
        {"two": model("supervisord", "mlx-two", service=service, log_files=logs)},
    )
    out = render_ok("supervisord", inventory, tmp_path / "out")
    (program,) = supervisor_programs(tmp_path, out / "supervisord" / "n1")
    assert not program["redirect"]
    assert [program["stderr"], program["stdout"]] == logs
    for stream in ("stdout", "stderr"):
        assert program[f"{stream}_maxbytes"] == 100 * 1024 * 1024
        assert program[f"{stream}_backups"] == 7


def test_a_log_path_with_a_space_is_refused_for_systemd(tmp_path: Path):
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/mlx-medic/bin/mlx-medic"}},
        {"m1": model("systemd", "m1", log_files=["/var/log/my logs/m1.log"])},
    )
    code, _, err = render("systemd", inventory, tmp_path / "out")
    assert code == EXIT_USAGE and "models.m1.log_files" in err and "no spaces" in err


def test_the_example_inventorys_units_verify_in_a_root_that_has_their_binaries(tmp_path: Path):
    """The example's units name /opt/mlx-medic/...: verified inside a temp root that holds
    that binary and the system's own units (sysinit.target and the like), never this
    machine's /etc or /opt."""
    systemd_analyze = require_tool("systemd-analyze")
    out = render_example("systemd", tmp_path / "out") / "systemd"
    root = tmp_path / "root"
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    shutil.copytree(
        "/usr/lib/systemd/system", root / "usr" / "lib" / "systemd" / "system", symlinks=True
    )
    medic = root / "opt" / "mlx-medic" / ".venv" / "bin" / "mlx-medic"
    medic.parent.mkdir(parents=True)
    medic.write_text("#!/bin/sh\nexit 0\n")
    medic.chmod(0o755)
    for node in sorted(p.name for p in out.iterdir() if p.is_dir()):
        shutil.copy(out / node / "mlx-medic-exporter.service", units)
        result = run(
            systemd_analyze, "verify", "--man=no", f"--root={root}", "mlx-medic-exporter.service"
        )
        assert result.returncode == 0 and not result.stderr.strip(), (node, result.stderr)
    shutil.copy(out / "mlx-medic-remediator.service", units)
    result = run(
        systemd_analyze, "verify", "--man=no", f"--root={root}", "mlx-medic-remediator.service"
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    medic.unlink()  # the check is real: without the binary the unit is refused
    result = run(
        systemd_analyze, "verify", "--man=no", f"--root={root}", "mlx-medic-remediator.service"
    )
    assert result.returncode != 0 and "mlx-medic" in result.stderr


def test_the_remediator_runs_the_same_command_and_config_under_systemd_and_launchd(
    tmp_path: Path,
):
    """Both jobs run `mlx-medic remediator` with MLX_MEDIC_CONFIG naming the config, where
    the on-call commands find it too; the unit's words say how to move it. The launchd job
    alone adds its log file: the unit's log is in the journal."""
    import plistlib

    out = render_example("all", tmp_path, "--remediator.config", "/srv/medic/r.yml")
    service = unit(out / "systemd" / "mlx-medic-remediator.service")
    with (out / "launchd" / "com.mlx-medic.remediator.plist").open("rb") as handle:
        job = plistlib.load(handle)
    command = ["/opt/mlx-medic/.venv/bin/mlx-medic", "remediator"]
    assert shlex.split(service["ExecStart"]) == command
    assert job["ProgramArguments"] == [
        *command,
        "--log.file",
        "/var/lib/mlx-medic-remediator/remediator.log",
    ]
    assert "StandardOutput" not in service and "StandardError" not in service
    environment = dict(word.split("=", 1) for word in shlex.split(service["Environment"]))
    assert environment == job["EnvironmentVariables"]
    assert environment["MLX_MEDIC_CONFIG"] == "/srv/medic/r.yml"
    text = (out / "systemd" / "mlx-medic-remediator.service").read_text()
    assert "render again with --remediator.config" in " ".join(text.replace("#", "").split())


# --- the state dirs: one owner each, no StateDirectory= fight --------------------------


def test_no_unit_takes_the_nodes_state_dir_and_the_remediator_has_its_own(
    linux: tuple[Path, Path],
):
    """systemd re-owns a StateDirectory= to its unit's User at every start: the root
    exporter and the remediator's user naming one would take it from each other (and
    from the node's login user). The exporter only may write the node's state dir (`-`:
    a dir not made yet does not stop it); the remediator's journal is in a dir of its own."""
    from mlx_medic.remediator.config import load_config
    from mlx_medic.state.layout import REMEDIATOR_STATE_DIR, REMEDIATOR_STATE_DIRECTORY

    out, _ = linux
    exporter = unit(out / "systemd" / "n1" / "mlx-medic-exporter.service")
    remediator = unit(out / "systemd" / "mlx-medic-remediator.service")
    assert "StateDirectory" not in exporter
    assert exporter["ReadWritePaths"] == "-/var/lib/mlx-medic"
    assert exporter["ProtectSystem"] == "strict" and exporter["UMask"] == "0027"
    assert remediator["StateDirectory"] == REMEDIATOR_STATE_DIRECTORY
    assert (remediator["UMask"], remediator["User"]) == ("0027", "mlx-medic")
    shipped = load_config(Path(__file__).resolve().parents[2] / "deploy" / "remediator.yml")
    assert shipped.journal.parent == REMEDIATOR_STATE_DIR


def tmpfiles_root(root: Path, uid: int, gid: int) -> Path:
    """A root for `systemd-tmpfiles --root` whose own /etc names the login user and the
    group (systemd-tmpfiles resolves names there, never in this machine's /etc)."""
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(
        f"root:x:0:0::/root:/bin/sh\nmedic:x:{uid}:{uid}::/home/medic:/bin/sh\n"
    )
    (root / "etc" / "group").write_text(f"root:x:0:\nmedic:x:{uid}:\nmlx-medic:x:{gid}:medic\n")
    return root


def test_the_tmpfiles_line_makes_a_non_default_state_dir_for_the_login_user(tmp_path: Path):
    """A state_dir that does not exist yet: ReadWritePaths=- does not stop the exporter,
    and systemd-tmpfiles (at boot, before it starts) makes the dir and its dirs as the
    layout says, and gives back one another unit re-owned."""
    from mlx_medic.state.layout import DIR_MODE, DIRS

    tmpfiles = require_tool("systemd-tmpfiles")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "state_dir": "/srv/mlx/state",
                "nodes": {
                    "n1": {
                        "ssh": "127.0.0.2",
                        "user": "medic",
                        "medic_command": "/opt/mlx-medic/.venv/bin/mlx-medic",
                    }
                },
                "models": {"m1": model("systemd", "m1")},
            }
        )
    )
    out = render_ok("systemd", inventory, tmp_path / "out")
    exporter = unit(out / "systemd" / "n1" / "mlx-medic-exporter.service")
    assert exporter["ReadWritePaths"] == "-/srv/mlx/state"
    conf = out / "systemd" / "n1" / "tmpfiles.d" / "mlx-medic.conf"
    root = tmpfiles_root(tmp_path / "root", 4242, 4243)
    state = root / "srv" / "mlx" / "state"

    def create() -> None:
        result = run(tmpfiles, "--create", f"--root={root}", str(conf))
        assert result.returncode == 0 and not result.stderr.strip(), result.stderr

    create()
    for path in (state, *(state / part for part in DIRS)):
        info = path.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (4242, 4243, DIR_MODE), path
    os.chown(state, 0, 0)  # a unit with StateDirectory= started and took it
    create()
    assert (state.stat().st_uid, state.stat().st_gid) == (4242, 4243)


def test_a_state_dir_tmpfiles_cannot_say_is_refused_naming_the_field(tmp_path: Path):
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "state_dir": "/srv/my state",
                "nodes": {
                    "n1": {"ssh": "127.0.0.2", "medic_command": "/opt/mlx-medic/bin/mlx-medic"}
                },
                "models": {"m1": model("systemd", "m1")},
            }
        )
    )
    code, _, err = render("systemd", inventory, tmp_path / "out")
    assert code == EXIT_USAGE and "state_dir" in err and "without spaces" in err


def test_the_launchd_remediator_logs_in_its_own_dir_not_the_nodes_state_dir(tmp_path: Path):
    import plistlib

    from mlx_medic.state.layout import REMEDIATOR_STATE_DIR

    out = render_example("launchd", tmp_path / "out")
    with (out / "launchd" / "com.mlx-medic.remediator.plist").open("rb") as handle:
        job = plistlib.load(handle)
    assert Path(job["StandardErrorPath"]).parent == REMEDIATOR_STATE_DIR
