"""`mlx-medic doctor` is read-only: every command it may run is in one allow-list, every
helper call it may send a node (`--config.file`) in another, no entry stops, starts,
locks, sweeps, cleans, signals, records or removes anything, and a run of every check
through a recording runner (a recording transport) runs (sends) only what the list
holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_medic.doctor.commands import (
    READ_ONLY_COMMANDS,
    READ_ONLY_HELPER_CALLS,
    NotReadOnly,
    ReadOnlyTransport,
    allowed_as,
    guarded,
    helper_call_allowed_as,
    is_read_only,
)
from mlx_medic.doctor.framework import FAILED
from mlx_medic.doctor.report import all_checks, build_report
from mlx_medic.inventory.load import load_inventory
from mlx_medic.node.client import helper_argv
from mlx_medic.platform.macos_rdma import IBV_DEVINFO_ARGV, IOCLASSCOUNT_ARGV
from mlx_medic.platform.proc_macos import PS_COMMAND
from tests.doctor.fakes import Machine, context, fixture_output, inventory, ok

SERVICE_ACTIONS = {"stop", "start", "restart"}
LOCK_ACTIONS = {"take", "replace", "release", "break"}
RECORDS = {"backend": {"set"}, "run": {"set", "renew", "clear"}}  # helper -> actions that write
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
    if any(helper in words and set(words) & actions for helper, actions in RECORDS.items()):
        return "writes a node's record"
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
        ("mlx-medic", "node", "backend", "glm", "set", "ring"),
        ("mlx-medic", "node", "run", "glm", "renew", "20260101T000000Z-00000000"),
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


@pytest.mark.parametrize("entry", READ_ONLY_HELPER_CALLS, ids=lambda e: " ".join(e))
def test_no_allowed_helper_call_changes_anything(entry: tuple[str, ...]):
    assert forbidden(("mlx-medic", "node", *entry)) is None, entry


@pytest.mark.parametrize(
    "words",
    [
        ("service", "glm", "stop"),
        ("service", "glm", "start"),
        ("service", "glm", "restart"),
        ("lock", "glm", "take"),
        ("lock", "glm", "release"),
        ("lock", "glm", "break"),
        ("lock", "glm", "replace"),
        ("backend", "glm", "set", "ring"),
        ("run", "glm", "set", "20260101T000000Z-00000000"),
        ("run", "glm", "clear", "20260101T000000Z-00000000"),
        ("sweep", "glm"),
        ("sweep", "glm", "--orphans-only"),
        ("clean", "glm"),
        ("sweep", "--dry-run", "--dry-run"),  # a model word never starts with `-`
        ("facts", "glm", "--lines", "5"),
    ],
    ids=" ".join,
)
def test_the_transport_guard_refuses_every_call_that_is_not_read_only_before_it_is_sent(
    words: tuple[str, ...], tmp_path: Path
):
    path = tmp_path / "inventory.yaml"
    inventory(path)
    node = load_inventory(path).nodes[0]
    sent: list[list[str]] = []

    class Recording:
        async def run(self, node: object, argv: list[str], *, timeout: float) -> object:
            sent.append(argv)
            raise AssertionError("sent")

        async def close(self) -> None:
            return None

    argv = helper_argv(node, words[0], words[1:])
    assert helper_call_allowed_as(node, argv) is None
    with pytest.raises(NotReadOnly, match=f"may not send .* to {node.name}"):
        asyncio.run(ReadOnlyTransport(Recording()).run(node, argv, timeout=5))
    assert sent == []


def test_a_helper_call_is_allowed_only_with_the_clients_whole_tail(tmp_path: Path):
    path = tmp_path / "inventory.yaml"
    inventory(path)
    node = load_inventory(path).nodes[0]
    argv = helper_argv(node, "lock", ["glm", "show"])
    assert helper_call_allowed_as(node, argv) == ("lock", "{model}", "show")
    assert helper_call_allowed_as(node, [*argv[:-1], "--text"]) is None
    assert helper_call_allowed_as(node, ["/usr/bin/other", *argv[1:]]) is None
    other = argv[:]
    other[other.index("--inventory") + 1] = "/tmp/another.yaml"
    assert helper_call_allowed_as(node, other) is None
