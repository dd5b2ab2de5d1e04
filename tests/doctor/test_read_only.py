"""`mlx-medic doctor` is read-only: every command it may run is in one allow-list, no
entry stops, starts, locks, sweeps, cleans, signals or removes anything, and a run of
every check through a recording runner runs only what the list holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_medic.doctor.commands import (
    READ_ONLY_COMMANDS,
    NotReadOnly,
    allowed_as,
    guarded,
    is_read_only,
)
from mlx_medic.doctor.framework import FAILED
from mlx_medic.doctor.report import all_checks, build_report
from mlx_medic.platform.macos_rdma import IBV_DEVINFO_ARGV, IOCLASSCOUNT_ARGV
from mlx_medic.platform.proc_macos import PS_COMMAND
from tests.doctor.fakes import Machine, context, fixture_output, inventory, ok

SERVICE_ACTIONS = {"stop", "start", "restart"}
LOCK_ACTIONS = {"take", "replace", "release", "break"}
LAUNCHD_CHANGES = {"bootout", "bootstrap", "kickstart", "kill", "load", "unload", "enable"}
NEVER = {"kill", "pkill", "killall", "rm", "rmdir", "unlink", "mv", "chmod", "chown", "reboot"}


def forbidden(words: tuple[str, ...]) -> str | None:
    """Why `words` would change something, or None."""
    names = {w.rsplit("/", 1)[-1] for w in words}
    if names & NEVER:
        return f"runs {sorted(names & NEVER)}"
    if "service" in words and set(words) & SERVICE_ACTIONS:
        return "stops or starts a service"
    if "lock" in words and set(words) & LOCK_ACTIONS:
        return "takes or drops a lock"
    if set(words) & {"sweep", "clean"} and "--dry-run" not in words:
        return "sweeps or cleans for real"
    if names & {"launchctl", "systemctl", "supervisorctl"} and set(words) & (
        LAUNCHD_CHANGES | SERVICE_ACTIONS
    ):
        return "changes a service manager's job"
    if names & {"sudo"} and "-l" not in words:
        return "runs a command as root"
    return None


@pytest.mark.parametrize("entry", READ_ONLY_COMMANDS, ids=lambda e: " ".join(e)[:40])
def test_no_allowed_command_changes_anything(entry: tuple[str, ...]):
    assert forbidden(entry) is None, entry


@pytest.mark.parametrize(
    "argv",
    [
        ("mlx-medic", "node", "service", "glm", "stop", "--by", "doctor"),
        ("mlx-medic", "node", "lock", "glm", "take"),
        ("mlx-medic", "node", "sweep", "glm"),
        ("mlx-medic", "node", "clean", "glm"),
        ("/bin/launchctl", "bootout", "system/glm"),
        ("kill", "-9", "1"),
        ("rm", "-rf", "/"),
    ],
)
def test_the_screen_itself_catches_each_kind_of_change(argv: tuple[str, ...]):
    assert forbidden(argv) is not None
    assert not is_read_only(argv)


def test_a_placeholder_stands_for_one_word_never_an_option():
    assert is_read_only(("/bin/launchctl", "print", "system/com.example.glm"))
    assert not is_read_only(("/bin/launchctl", "print", "system/glm", "extra"))
    assert not is_read_only(("sudo", "-n", "-l", "-U", "-h"))
    assert not is_read_only(("--version", "--version"))
    assert not is_read_only(("/opt/python3", "-c", "import os; os.remove('x')"))


def test_the_guard_refuses_a_command_outside_the_list_before_it_runs():
    machine = Machine()
    run = guarded(machine.run_as(None))
    with pytest.raises(NotReadOnly, match="may not run `/bin/launchctl bootout system/glm`"):
        run(("/bin/launchctl", "bootout", "system/glm"), 5)
    assert machine.calls == []


def a_full_machine() -> Machine:
    """Answers that take every check down its longest path."""
    no_such = (  # ioclasscount's `<no such class>` form, for the classes the exporter asks
        "AppleThunderboltRDMAProtectionDomain = <no such class>, "
        "AppleThunderboltRDMAQueuePair = <no such class>\n"
    )
    ps_rows = "  101     1 Us+\n  102   101 Ss\n"
    return Machine(
        {
            PS_COMMAND: ok(PS_COMMAND, ps_rows),
            IBV_DEVINFO_ARGV: ok(IBV_DEVINFO_ARGV, fixture_output("ibv_devinfo_tn3205.txt")),
            IOCLASSCOUNT_ARGV: ok(IOCLASSCOUNT_ARGV, no_such),
            ("ioclasscount",): ok(("ioclasscount",), fixture_output("ioclasscount_zero.txt")),
        }
    )


@pytest.mark.parametrize("platform", ["darwin", "linux"])
@pytest.mark.parametrize("user", ["root", "ai", "ops"])
def test_every_check_runs_only_allowed_commands(platform: str, user: str, tmp_path: Path):
    path = tmp_path / "inventory.yaml"
    inventory(path, service={"manager": "launchd", "label": "glm", "kind": "wrapper"})
    machine = a_full_machine()
    doctor = context(
        machine, platform=platform, user=user, inventory_path=path, home_of=lambda u: tmp_path
    )
    report = build_report(doctor, "--node")  # the header's commands and every check's
    crashed = [
        r for r in report.results if r.status == FAILED and "the check itself failed" in r.detail
    ]
    assert crashed == []
    assert machine.calls, "the checks ran nothing"
    assert [argv for _, argv in machine.calls if not is_read_only(argv)] == []


def test_every_allowed_command_is_one_a_check_runs(tmp_path: Path):
    path = tmp_path / "inventory.yaml"
    inventory(path, service={"manager": "launchd", "label": "glm", "kind": "wrapper"})
    used = set()
    for user in ("root", "ai"):
        machine = a_full_machine()
        build_report(context(machine, user=user, inventory_path=path, home_of=lambda u: tmp_path))
        used |= {allowed_as(argv) for _, argv in machine.calls}
    assert set(READ_ONLY_COMMANDS) - used == set()
    assert len(all_checks()) == len({c.name for c in all_checks()})
