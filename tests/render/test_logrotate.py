"""logrotate rules for the log files of systemd models, checked and run by Debian's
logrotate on files the test owns (its own state file, never /etc/logrotate.d)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from tests.render.helpers import model, render_ok, run, write_inventory
from tests.tools import require_tool

NODES = {"n1": {"ssh": "127.0.0.2", "medic_command": "/opt/mlx-medic/bin/mlx-medic"}}


def systemd_inventory(tmp_path: Path) -> tuple[Path, list[Path]]:
    me = pwd.getpwuid(os.getuid()).pw_name
    logs = [tmp_path / "logs" / "m1.err.log", tmp_path / "logs" / "m1.out.log"]
    inventory = write_inventory(
        tmp_path / "inv.yaml",
        NODES,
        {
            "m1": model(
                "systemd",
                "m1",
                service={"manager": "systemd", "label": "m1", "user": me},
                log_files=[str(p) for p in logs],
            ),
            "s1": model("supervisord", "s1", port=8081),  # supervisord rotates its own
        },
    )
    return inventory, logs


def test_every_log_a_systemd_model_unit_appends_to_has_a_rule_on_its_head(tmp_path: Path):
    inventory, logs = systemd_inventory(tmp_path)
    out = render_ok("systemd", inventory, tmp_path / "out")
    unit = (out / "systemd" / "n1" / "m1.service").read_text()
    appended = [line.split(":", 1)[1] for line in unit.splitlines() if "=append:" in line]
    assert sorted(appended) == sorted(str(p) for p in logs)

    render_ok("logrotate", inventory, out)
    rule = (out / "logrotate" / "n1" / "mlx-medic").read_text()
    for log in logs:
        assert str(log) in rule
    assert "copytruncate" in rule and "size 100M" in rule and "rotate 7" in rule
    assert "/var/log/mlx/m.err.log" not in rule  # the supervisord model's logs are not here


def test_logrotate_truncates_the_log_in_place_and_keeps_the_copy(tmp_path: Path):
    """copytruncate: the service's O_APPEND descriptor keeps working, its next line lands
    in the emptied file, and what was there is in `.1` for the logs collector."""
    logrotate = require_tool("logrotate")
    inventory, (err_log, out_log) = systemd_inventory(tmp_path)
    out = render_ok("logrotate", inventory, tmp_path / "out")
    rule = out / "logrotate" / "n1" / "mlx-medic"
    err_log.parent.mkdir(mode=0o755)
    state = tmp_path / "logrotate.state"

    checked = run(logrotate, "--debug", "--state", str(state), str(rule))
    assert checked.returncode == 0, checked.stderr

    with err_log.open("a") as service:  # as systemd opened it: append
        service.write("RuntimeError: [jaccl] Couldn't allocate protection domain\n")
        service.flush()
        rotated = run(logrotate, "--force", "--state", str(state), str(rule))
        assert rotated.returncode == 0, rotated.stderr
        service.write("the next line\n")
    assert err_log.read_text() == "the next line\n"
    assert Path(f"{err_log}.1").read_text().startswith("RuntimeError: [jaccl]")
    assert not out_log.exists()  # missingok: a log not written yet is no error
