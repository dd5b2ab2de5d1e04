"""On-call commands against the default paths, in a private mount namespace.

The defaults are machine paths (/etc/mlx-medic/remediator.yml, /var/lib/mlx-medic), so
a test of them must never touch the machine's own: `in_private_etc` runs one scenario
of this module under `unshare --mount --pid`, where /etc and /var/lib are overlays whose
writes land in a tmpfs that ends with the namespace. The scenario may then install the
shipped config, add users to /etc/passwd (the unit's `mlx-medic`, an on-call `alice`),
run the CLI and the service as them, and print what it saw as one JSON line.

Host side: `in_private_etc(tmp_path, "scenario")`. Inside: `python -m
tests.remediator.private_etc SCENARIO SCRATCH`.
"""

from __future__ import annotations

import configparser
import grp
import json
import os
import pwd
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HOST_MOUNT_NS = "PRIVATE_ETC_HOST_MOUNT_NS"
OVERLAID = ("/etc", "/var/lib")
CONFIG = Path("/etc/mlx-medic/remediator.yml")
INVENTORY = Path("/etc/mlx-medic/inventory.yaml")
STATE_DIR = Path("/var/lib/mlx-medic")  # the inventory's: a node's state dir
REMEDIATOR_DIR = Path("/var/lib/mlx-medic-remediator")  # the unit's own StateDirectory=
UNIT = REPO / "deploy" / "systemd" / "mlx-medic-remediator.service"


# --- host side ------------------------------------------------------------------------


def in_private_etc(
    tmp_path: Path,
    scenario: str,
    timeout: float = 240,
    module: str = "tests.remediator.private_etc",
    *args: str,
) -> dict[str, Any]:
    """Run `scenario` of `module` (whose `main(scenario, scratch, *args)` mounts the private
    dirs first) in a new mount and PID namespace (everything it starts ends with it); its
    JSON result."""
    from tests.tools import require_root, require_tool

    require_root()
    unshare = require_tool("unshare")
    require_tool("mount")
    scratch = tmp_path / "private-etc"
    scratch.mkdir()
    env = {**os.environ, HOST_MOUNT_NS: os.readlink("/proc/self/ns/mnt")}
    for name in ("MLX_MEDIC_CONFIG", "SUDO_USER", "SUDO_UID", "SUDO_GID"):
        env.pop(name, None)
    result = subprocess.run(
        [
            unshare,
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            sys.executable,
            "-m",
            module,
            scenario,
            str(scratch),
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.splitlines()[-1])


# --- namespace side: the private /etc and /var/lib --------------------------------------


def _mount_overlays(scratch: Path) -> None:
    """Refuses unless this is a mount namespace of its own; then tmpfs on `scratch` and an
    overlay on each of OVERLAID whose upper layer is in it."""
    if os.readlink("/proc/self/ns/mnt") == os.environ[HOST_MOUNT_NS]:
        raise SystemExit("not in a private mount namespace: refusing to touch /etc")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(scratch)], check=True)
    for target in OVERLAID:
        _overlay(Path(target), scratch)
    mounts = {
        line.split()[1]: line.split()[2]
        for line in Path("/proc/self/mounts").read_text().splitlines()
    }
    if any(mounts.get(target) != "overlay" for target in OVERLAID):
        raise SystemExit(f"/etc or /var/lib is not the private overlay: {mounts}")
    _let_every_user_run_python(scratch)


def _overlay(target: Path, scratch: Path) -> None:
    layer = scratch / "layers" / str(target).strip("/").replace("/", "-")
    (layer / "upper").mkdir(parents=True)
    (layer / "work").mkdir()
    subprocess.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={target},upperdir={layer / 'upper'},workdir={layer / 'work'}",
            str(target),
        ],
        check=True,
    )


def _let_every_user_run_python(scratch: Path) -> None:
    """The interpreter may live under a home only root may enter (e.g. /root/.pyenv): here,
    and only here, each directory on its way that others cannot enter gets o+x on an
    overlay, so the service's user and on-call users can run this checkout."""
    used = {Path(os.path.realpath(sys.executable)), Path(sys.base_prefix), Path(sys.prefix), REPO}
    for directory in sorted({d for path in used for d in path.parents} - {Path("/")}):
        mode = directory.stat().st_mode
        if not mode & 0o001:
            _overlay(directory, scratch)
            directory.chmod(mode | 0o001)


def add_user(name: str, home: Path) -> pwd.struct_passwd:
    """A system user in the private /etc/passwd and /etc/group with a same-named primary
    group, at a free id below 1000 that no user or group has (so each id names one group)."""
    taken = (
        {p.pw_uid for p in pwd.getpwall()}
        | {p.pw_gid for p in pwd.getpwall()}
        | {g.gr_gid for g in grp.getgrall()}
    )
    uid = next(i for i in range(999, 100, -1) if i not in taken)
    with open("/etc/passwd", "a") as passwd:
        passwd.write(f"{name}:x:{uid}:{uid}:{name}:{home}:/usr/sbin/nologin\n")
    with open("/etc/group", "a") as group:
        group.write(f"{name}:x:{uid}:\n")
    return pwd.getpwnam(name)


def owners(directory: Path) -> dict[str, str]:
    """Each file in `directory` and the name of its owner."""
    return (
        {
            entry.name: pwd.getpwuid(entry.stat().st_uid).pw_name
            for entry in sorted(directory.iterdir())
        }
        if directory.exists()
        else {}
    )


def modes(directory: Path) -> dict[str, str]:
    """Each file in `directory` and its mode, as `ls -l` would say it in octal."""
    return (
        {
            entry.name: f"{entry.stat().st_mode & 0o7777:04o}"
            for entry in sorted(directory.iterdir())
        }
        if directory.exists()
        else {}
    )


def mlx_medic(
    *args: str, user: pwd.struct_passwd | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The CLI as a person runs it, from /, with a plain environment; as root unless `user`."""
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": user.pw_dir if user else "/root",
        "PYTHONPATH": str(REPO),
    }
    result = subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", *args],
        cwd="/",
        env={**base, **(env or {})},
        user=user.pw_uid if user else None,
        group=user.pw_gid if user else None,
        extra_groups=[] if user else None,
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


# --- scenarios ------------------------------------------------------------------------


def no_config(scratch: Path) -> dict[str, Any]:
    """A host without the remediator's config (a node has only the inventory): every
    on-call command refuses, and nothing is written anywhere."""
    INVENTORY.parent.mkdir()
    INVENTORY.write_text(_inventory())
    home = scratch / "home"
    home.mkdir()
    commands = [
        ["pause", _model()],
        ["pause"],
        ["resume", _model()],
        ["resume"],
        ["log"],
        ["remediate", _model(), "--dry-run"],
    ]
    runs = [mlx_medic(*command, env={"HOME": str(home)}) for command in commands]
    return {
        "runs": runs,
        "etc": sorted(p.name for p in INVENTORY.parent.iterdir()),
        "state_dir_exists": STATE_DIR.exists(),
        "home": sorted(str(p.relative_to(home)) for p in home.rglob("*")),
    }


def service_host(scratch: Path) -> dict[str, Any]:
    """The remediator's host as the shipped files set it up: the config at the default
    path, the journal in the unit's own StateDirectory owned by the unit's User. On-call
    pauses with sudo before the service ever started, then while it serves alerts."""
    service_user = add_user("mlx-medic", REMEDIATOR_DIR)
    alice = add_user("alice", Path("/home/alice"))
    port = _free_port()
    _install_config(port)
    mode = int(shipped_unit()["StateDirectoryMode"], 8)
    REMEDIATOR_DIR.mkdir(mode=mode)  # what systemd's StateDirectory= makes
    os.chmod(REMEDIATOR_DIR, mode)
    os.chown(REMEDIATOR_DIR, service_user.pw_uid, service_user.pw_gid)
    sudo = {"SUDO_USER": "alice", "SUDO_UID": str(alice.pw_uid)}
    seen: dict[str, Any] = {"model": _model()}

    seen["first_pause"] = mlx_medic("pause", _model(), "--reason", "bob is on ai002", env=sudo)
    seen["after_first_pause"] = owners(REMEDIATOR_DIR)
    seen["alice_without_sudo"] = mlx_medic("pause", user=alice)

    service = _start_like_the_unit(service_user, port, scratch / "service.log")
    try:
        seen["paused_event"] = _fire_and_wait(port, "fp-1", sudo)
        seen["resume"] = mlx_medic("resume", _model(), env=sudo)
        seen["pause_all"] = mlx_medic("pause", env=sudo)
        seen["while_serving"] = owners(REMEDIATOR_DIR)
        seen["modes_while_serving"] = modes(REMEDIATOR_DIR)
        seen["paused_all_event"] = _fire_and_wait(port, "fp-2", sudo)
        seen["log"] = mlx_medic("log", "--json", env=sudo)
    finally:
        service.send_signal(signal.SIGTERM)
        seen["service_exit"] = service.wait(30)
        seen["service_log"] = (scratch / "service.log").read_text(errors="replace")[-3000:]
    seen["after_service"] = owners(REMEDIATOR_DIR)
    seen["state_dir_exists"] = STATE_DIR.exists()
    return seen


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "no_config": no_config,
    "service_host": service_host,
}


# --- what the scenarios use -----------------------------------------------------------


def _model() -> str:
    from tests.remediator.engine_fakes import MODEL

    return MODEL


def _inventory() -> str:
    from tests.remediator.engine_fakes import inventory_text

    return inventory_text(STATE_DIR)


def shipped_unit() -> configparser.SectionProxy:
    """The [Service] section of the shipped remediator unit."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT)
    return unit["Service"]


def _free_port() -> int:
    from tests.remediator.conftest import free_port

    return free_port()


def _install_config(port: int) -> None:
    """The shipped deploy/remediator.yml at the default path, its journal and inventory
    paths kept; no secrets to install (no auth), a dry run, a free port."""
    config = yaml.safe_load((REPO / "deploy" / "remediator.yml").read_text())
    config.update(auth={}, insecure_no_auth=True, dry_run=True, listen=f"127.0.0.1:{port}")
    CONFIG.parent.mkdir(exist_ok=True)
    CONFIG.write_text(yaml.safe_dump(config))
    Path(config["inventory"]).write_text(_inventory())


def _start_like_the_unit(user: pwd.struct_passwd, port: int, log: Path) -> subprocess.Popen[bytes]:
    """The unit's ExecStart with its Environment, as its User, from / (systemd's defaults);
    the console script is this checkout's."""
    from tests.remediator.conftest import wait_for_port

    service = shipped_unit()
    assert service["User"] == user.pw_name
    unit_env = dict(word.split("=", 1) for word in shlex.split(service["Environment"]))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **unit_env}
    argv = shlex.split(service["ExecStart"])  # no variables: the config is MLX_MEDIC_CONFIG
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlx_medic.cli", *argv[1:]],
            cwd="/",
            env=env,
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        wait_for_port(port, process)  # type: ignore[arg-type]
    except Exception:
        process.kill()
        raise RuntimeError(log.read_text(errors="replace")[-3000:]) from None
    return process


def _fire_and_wait(port: int, fingerprint: str, sudo: dict[str, str]) -> dict[str, Any]:
    """POST one LLMModelDown firing for the model; the event the service journaled for it,
    read back with `mlx-medic log --json` (no flags)."""
    from tests.remediator.conftest import make_alert, make_payload

    body = json.dumps(make_payload(make_alert(_model(), fingerprint=fingerprint))).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/alerts",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status = response.status
    except urllib.error.HTTPError as exc:  # e.g. a journal the service cannot write
        return {"status": exc.code, "kind": None, "body": exc.read().decode(errors="replace")}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        logged = mlx_medic("log", "--json", env=sudo)
        if logged["code"] == 0:
            events = json.loads(logged["out"])["events"]
            mine = [e for e in events if e["fingerprint"] == fingerprint]
            if mine:
                return {"status": status, **mine[0]}
        time.sleep(0.3)
    return {"status": status, "kind": None}


def main(scenario: str, scratch: Path) -> None:
    _mount_overlays(scratch)
    result = SCENARIOS[scenario](scratch)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
