"""A node's state dir shared by three users, in a private mount namespace.

Run by `in_private_etc(..., module="tests.private_state_dir")`: /etc and /var/lib are the
private overlays of tests/remediator/private_etc.py, so the default paths
(/var/lib/mlx-medic, /var/lib/mlx-medic-remediator) are real here and the machine's own
never touched. On this host, as on one that runs a node and the remediator:

- root runs the exporter (its service collector and its probe, in this process);
- `medic` is the node's login user (nodes.n1.user): the node helpers and the probe the
  remediator runs on the head, `mlx-medic probe --lock-dir`, run as it;
- `mlx-medic` is the remediator's user, its primary group `mlx-medic` the layout's group
  (medic is a member, as the docs ask).

Each scenario starts the components in one order and prints what each saw, and the
owner, group and mode of every entry of both state dirs, as one JSON line.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.remediator.private_etc import REPO, _mount_overlays
from tests.remediator.private_etc import add_user as _add_user

STATE_DIR = Path("/var/lib/mlx-medic")
REMEDIATOR_DIR = Path("/var/lib/mlx-medic-remediator")
INVENTORY = Path("/etc/mlx-medic/inventory.yaml")
REMEDIATOR_CONFIG = Path("/etc/mlx-medic/remediator.yml")
MODEL = "m1"


# --- the host -------------------------------------------------------------------------


def _host(scratch: Path) -> dict[str, Any]:
    """The users, the inventory and the remediator's config; a port nothing listens on
    (the probes read `down`, having taken their lock)."""
    remediator = _add_user("mlx-medic", REMEDIATOR_DIR)
    medic = _add_user("medic", Path("/home/medic"))
    group = Path("/etc/group")
    group.write_text(
        group.read_text().replace(
            f"mlx-medic:x:{remediator.pw_gid}:\n", f"mlx-medic:x:{remediator.pw_gid}:medic\n"
        )
    )
    port = _closed_port()
    INVENTORY.parent.mkdir(exist_ok=True)
    INVENTORY.write_text(f"""\
state_dir: {STATE_DIR}
nodes:
  n1: {{ssh: 127.0.0.2, user: medic, medic_command: {REPO}/.venv/bin/mlx-medic}}
models:
  {MODEL}:
    model: /models/m1
    nodes: [n1]
    host: 127.0.0.1
    port: {port}
    service: {{manager: supervisord, label: m1}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
""")
    REMEDIATOR_CONFIG.write_text(
        f"inventory: {INVENTORY}\njournal: {REMEDIATOR_DIR / 'journal.sqlite'}\n"
    )
    return {
        "port": port,
        "medic": medic.pw_uid,
        "group": remediator.pw_gid,
        "scratch": str(scratch),
    }


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as(user: str, *args: str) -> dict[str, Any]:
    """`mlx-medic ARGS` as `user` with its groups, from /, with a plain environment."""
    account = pwd.getpwnam(user)
    env = {"PATH": "/usr/bin:/bin", "HOME": account.pw_dir, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", *args],
        cwd="/",
        env=env,
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=os.getgrouplist(user, account.pw_gid),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return {
        "argv": list(args),
        "code": result.returncode,
        "out": result.stdout,
        "err": result.stderr,
    }


def layout(directory: Path) -> dict[str, str]:
    """Every entry under `directory` (and it, as "."): `owner:group mode`."""
    if not directory.exists():
        return {}
    found = {}
    for path in [directory, *sorted(directory.rglob("*"))]:
        info = path.lstat()
        owner, group = pwd.getpwuid(info.st_uid).pw_name, grp.getgrgid(info.st_gid).gr_name
        name = "." if path == directory else str(path.relative_to(directory))
        found[name] = f"{owner}:{group} {stat.S_IMODE(info.st_mode):04o}"
    return found


# --- the components, by the code paths that create things -----------------------------


class _Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def exporter_starts() -> dict[str, Any]:
    """The root exporter's start and one round of its probes (as `build` and its service
    collector do); what it logged at WARNING and above."""
    from mlx_medic.exporter.collector import ExporterContext
    from mlx_medic.exporter.collectors import service
    from mlx_medic.inventory.load import load_inventory

    logged = _Logged()
    logging.getLogger().addHandler(logged)
    try:
        inventory = load_inventory(INVENTORY)
        context = ExporterContext(node="n1", inventory=inventory, state_dir=inventory.state_dir)
        prepare = getattr(context, "prepare_state_dir", None)
        if prepare is not None:  # main.build does this before the collectors
            prepare()
        collector = service.make(context)
        try:
            assert isinstance(collector, service.ModelServiceCollector)
            collector.probe_all_once()
        finally:
            collector.close()
    finally:
        logging.getLogger().removeHandler(logged)
    return {"logged": logged.lines}


def remediator_pauses() -> dict[str, Any]:
    """The remediator's user writes its journal (in its own StateDirectory=, as systemd
    makes it: the unit's mode, owned by its User)."""
    from tests.remediator.private_etc import shipped_unit

    if not REMEDIATOR_DIR.exists():
        mode = int(shipped_unit().get("StateDirectoryMode", "0755"), 8)
        REMEDIATOR_DIR.mkdir(mode=mode)
        REMEDIATOR_DIR.chmod(mode)
        account = pwd.getpwnam("mlx-medic")
        os.chown(REMEDIATOR_DIR, account.pw_uid, account.pw_gid)
    return _as(
        "mlx-medic",
        "pause",
        MODEL,
        "--reason",
        "order test",
        "--config.file",
        str(REMEDIATOR_CONFIG),
    )


def remediator_probes_on_the_head(port: int) -> dict[str, Any]:
    """The probe the remediator runs on the head over SSH (`node probe` runs this same
    code under the same locks), as the node's login user: `mlx-medic probe --lock-dir`."""
    return _as(
        "medic",
        "probe",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--timeout",
        "2",
        "--lock-dir",
        str(STATE_DIR / "locks"),
    )


def helper_takes_the_model_lock(token: str) -> dict[str, Any]:
    """`mlx-medic node lock m1 take` as the node's login user, as the remediator sends it;
    then released, so the next one may take it."""
    from mlx_medic.state.model_lock_file import LockInfo

    info = LockInfo(
        node=None,
        pid=1,
        pid_start=None,
        host="remediator",
        time=1.0,
        holder="remediator",
        run_id="r1",
        expires=4e9,
        token=token,
    ).to_json()
    node = ("--inventory", str(INVENTORY), "--node", "n1", "--json")
    taken = _as("medic", "node", "lock", MODEL, "take", "--info", info, *node)
    released = _as("medic", "node", "lock", MODEL, "release", "--token", token, *node)
    return {"take": taken, "release": released}


def tmpfiles_applies_the_rendered_line(scratch: Path) -> dict[str, Any]:
    """`mlx-medic render systemd`'s tmpfiles.d file for n1, applied as systemd does at boot."""
    out = scratch / "rendered"
    render = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "render",
            "systemd",
            "--inventory",
            str(INVENTORY),
            "--out",
            str(out),
            "--remediator.command",
            f"{REPO}/.venv/bin/mlx-medic",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert render.returncode == 0, render.stderr
    conf = out / "systemd" / "n1" / "tmpfiles.d" / "mlx-medic.conf"
    tmpfiles = shutil.which("systemd-tmpfiles") or "systemd-tmpfiles"
    result = subprocess.run(
        [tmpfiles, "--create", str(conf)], capture_output=True, text=True, check=False
    )
    return {"code": result.returncode, "err": result.stderr}


def what_an_older_version_left() -> None:
    """The state dir as today's units and main leave it: systemd's StateDirectory= (root,
    0755), the exporter's locks/ 0700 and probe lock 0600, root's records 0644."""
    from mlx_medic.health import _lock_file_name
    from mlx_medic.inventory.load import load_inventory

    port = load_inventory(INVENTORY).model(MODEL).port
    STATE_DIR.mkdir(mode=0o755)
    (STATE_DIR / "locks").mkdir(mode=0o700)
    for path, mode in [
        (STATE_DIR / "locks" / _lock_file_name("127.0.0.1", port), 0o600),
        (STATE_DIR / "locks" / f"{MODEL}.lock.guard", 0o644),
        (STATE_DIR / "pd-ledger.lock", 0o644),
    ]:
        path.touch(mode)
        path.chmod(mode)
    (STATE_DIR / "runs").mkdir(mode=0o755)
    (STATE_DIR / "runs" / f"{MODEL}.current").write_text("r0\n")


# --- scenarios ------------------------------------------------------------------------


def exporter_first(scratch: Path) -> dict[str, Any]:
    host = _host(scratch)
    seen: dict[str, Any] = {"host": host}
    seen["exporter"] = exporter_starts()
    seen["pause"] = remediator_pauses()
    seen["probe"] = remediator_probes_on_the_head(host["port"])
    seen["lock"] = helper_takes_the_model_lock("a")
    seen["state_dir"] = layout(STATE_DIR)
    seen["remediator_dir"] = layout(REMEDIATOR_DIR)
    return seen


def remediator_first(scratch: Path) -> dict[str, Any]:
    host = _host(scratch)
    seen: dict[str, Any] = {"host": host}
    seen["pause"] = remediator_pauses()
    seen["probe_before_any_state_dir"] = remediator_probes_on_the_head(host["port"])
    seen["tmpfiles"] = tmpfiles_applies_the_rendered_line(scratch)
    seen["probe"] = remediator_probes_on_the_head(host["port"])
    seen["lock"] = helper_takes_the_model_lock("a")
    seen["state_dir_before_exporter"] = layout(STATE_DIR)
    seen["exporter"] = exporter_starts()
    seen["probe_after_exporter"] = remediator_probes_on_the_head(host["port"])
    seen["lock_after_exporter"] = helper_takes_the_model_lock("b")
    seen["state_dir"] = layout(STATE_DIR)
    seen["remediator_dir"] = layout(REMEDIATOR_DIR)
    return seen


def after_an_older_version(scratch: Path) -> dict[str, Any]:
    host = _host(scratch)
    what_an_older_version_left()
    seen: dict[str, Any] = {"host": host, "left": layout(STATE_DIR)}
    seen["lock_before"] = helper_takes_the_model_lock("a")
    seen["probe_before"] = remediator_probes_on_the_head(host["port"])
    seen["exporter"] = exporter_starts()
    seen["lock"] = helper_takes_the_model_lock("b")
    seen["probe"] = remediator_probes_on_the_head(host["port"])
    seen["state_dir"] = layout(STATE_DIR)
    os.chown(STATE_DIR, 0, 0)  # a unit with StateDirectory=mlx-medic started again
    seen["reowned"] = layout(STATE_DIR)["."]
    seen["tmpfiles"] = tmpfiles_applies_the_rendered_line(scratch)
    seen["after_tmpfiles"] = layout(STATE_DIR)["."]
    return seen


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "exporter_first": exporter_first,
    "remediator_first": remediator_first,
    "after_an_older_version": after_an_older_version,
}


def main(scenario: str, scratch: Path) -> None:
    _mount_overlays(scratch)
    print(json.dumps(SCENARIOS[scenario](scratch)))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
