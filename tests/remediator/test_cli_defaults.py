"""The big red button presses something: without `--config.file` the on-call commands act
on the journal the running service uses (the shipped units' config path), or refuse with
a non-zero exit; under sudo they leave no file the service cannot write.

These run in a private mount namespace (tests/remediator/private_etc.py): the defaults
are machine paths, and the machine's own /etc and /var/lib are never touched.
"""

from __future__ import annotations

import json
import plistlib
import re
import shlex
import socket
from pathlib import Path

import pytest

from mlx_medic.remediator.config import (
    CONFIG_ENV,
    DEFAULT_CONFIG_FILE,
    ConfigError,
    find_config_file,
    load_config,
)
from tests.remediator.private_etc import in_private_etc, shipped_unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture(autouse=True)
def machine_paths_untouched() -> object:
    before = {
        p: p.exists()
        for p in (
            DEFAULT_CONFIG_FILE.parent,
            Path("/var/lib/mlx-medic"),
            Path("/var/lib/mlx-medic-remediator"),
        )
    }
    yield
    assert {p: p.exists() for p in before} == before


def test_without_a_config_every_on_call_command_refuses_naming_the_flag_and_writes_nothing(
    tmp_path: Path,
) -> None:
    seen = in_private_etc(tmp_path, "no_config")
    for run in seen["runs"]:
        assert run["code"] == 2, run
        assert "nothing was changed" in run["err"] and "--config.file FILE" in run["err"], run
        assert f"{CONFIG_ENV}=FILE" in run["err"] and str(DEFAULT_CONFIG_FILE) in run["err"]
        assert run["out"] == "", run
    assert seen["etc"] == ["inventory.yaml"]  # a node's file is not the service's config
    assert not seen["state_dir_exists"] and seen["home"] == []


@pytest.fixture(scope="module")
def service_host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One run of the scenario: sudo pauses before the service ever started, then while
    the service (the unit's ExecStart, as its User) serves alerts."""
    return in_private_etc(tmp_path_factory.mktemp("service-host"), "service_host")


def test_pause_without_flags_under_sudo_writes_the_services_journal_as_its_owner(
    service_host: dict,
) -> None:
    first = service_host["first_pause"]
    assert first["code"] == 0, first
    assert first["err"].splitlines()[0] == (
        "mlx-medic: journal /var/lib/mlx-medic-remediator/journal.sqlite (new), named by"
        f" {DEFAULT_CONFIG_FILE} (the default path); written as mlx-medic, its owner"
    )
    assert f"paused automatic remediation for {service_host['model']}" in first["out"]
    # The config is at the default path, so the hint needs no flag.
    assert f"undo with: mlx-medic resume {service_host['model']}\n" in first["out"]
    assert service_host["after_first_pause"] == {"journal.sqlite": "mlx-medic"}


def test_the_running_service_reads_the_pause_the_command_wrote(service_host: dict) -> None:
    event = service_host["paused_event"]
    assert event["status"] < 300 and event["kind"] == "paused", event
    assert service_host["paused_all_event"]["kind"] == "paused", service_host
    assert service_host["service_exit"] == 0, service_host["service_log"]


def test_sudo_while_the_service_runs_leaves_no_root_owned_wal_or_shm(
    service_host: dict,
) -> None:
    for step in ("resume", "pause_all"):
        assert service_host[step]["code"] == 0, service_host[step]
        assert "written as mlx-medic, its owner" in service_host[step]["err"]
    files = service_host["while_serving"]
    assert {"journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm"} <= set(files)
    assert set(files.values()) == {"mlx-medic"}, files
    assert set(service_host["after_service"].values()) == {"mlx-medic"}


def test_the_journal_its_wal_and_shm_are_0640_in_the_remediators_own_dir(
    service_host: dict,
) -> None:
    """Readable by the service's user and group only; the node's state dir (the
    inventory's, /var/lib/mlx-medic) is not where the remediator keeps anything."""
    modes = service_host["modes_while_serving"]
    assert {
        modes[name] for name in ("journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm")
    } == {"0640"}, modes
    assert not service_host["state_dir_exists"]


def test_who_acted_is_the_sudo_user_at_the_host(service_host: dict) -> None:
    logged = json.loads(service_host["log"]["out"])
    (control,) = logged["controls"]
    assert control["model"] is None and control["by_whom"] == f"alice@{socket.gethostname()}"
    resumed = [e for e in logged["events"] if e["kind"] == "resumed"]
    assert resumed and resumed[0]["detail"].endswith(f"(alice@{socket.gethostname()})")


def test_a_user_who_cannot_write_the_journal_is_refused_naming_its_owner(
    service_host: dict,
) -> None:
    refused = service_host["alice_without_sudo"]
    assert refused["code"] == 2, refused
    assert (
        "cannot write the journal /var/lib/mlx-medic-remediator/journal.sqlite as alice:"
        " it belongs to mlx-medic"
    ) in refused["err"]


# --- the shipped units name the default path ----------------------------------------------


def test_the_systemd_unit_sets_MLX_MEDIC_CONFIG_to_the_default_path_and_runs_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlx_medic.cli import parse_args

    service = shipped_unit()
    environment = dict(word.split("=", 1) for word in shlex.split(service["Environment"]))
    assert environment[CONFIG_ENV] == str(DEFAULT_CONFIG_FILE)
    args = parse_args(shlex.split(service["ExecStart"])[1:])
    assert args.command == "remediator" and args.config_file is None
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    source = find_config_file(args.config_file)
    assert source is not None
    assert (source.path, source.found_by) == (DEFAULT_CONFIG_FILE, f"${CONFIG_ENV}")
    # Its own dir, /var/lib/mlx-medic-remediator, never the node's state dir (the exporter's)
    assert service["StateDirectory"] == "mlx-medic-remediator"
    assert str(load_config(DEPLOY / "remediator.yml").journal).startswith(
        "/var/lib/mlx-medic-remediator/"
    )


def test_the_launchd_plist_runs_the_remediator_with_MLX_MEDIC_CONFIG_at_the_default_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlx_medic.cli import parse_args

    with (DEPLOY / "launchd" / "com.mlx-medic.remediator.plist").open("rb") as handle:
        plist = plistlib.load(handle)
    args = parse_args(plist["ProgramArguments"][1:])
    assert args.command == "remediator" and args.config_file is None
    for name, value in plist["EnvironmentVariables"].items():
        monkeypatch.setenv(name, value)
    source = find_config_file(args.config_file)
    assert source is not None
    assert (source.path, source.found_by) == (DEFAULT_CONFIG_FILE, f"${CONFIG_ENV}")


def test_the_service_without_a_flag_finds_its_config_as_the_on_call_commands_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "remediator.yml"
    config_file.write_text(f"journal: {tmp_path / 'j.sqlite'}\n")
    monkeypatch.setenv(CONFIG_ENV, str(config_file))
    assert load_config(None).journal == tmp_path / "j.sqlite"
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "gone.yml"))
    with pytest.raises(ConfigError, match=r"gone\.yml \(\$MLX_MEDIC_CONFIG\)"):
        load_config(None)


RUNBOOKS = DEPLOY.parent / "alerting-rules" / "runbooks"
ON_CALL_COMMAND = re.compile(r"mlx-medic (pause|resume|log|remediate)\b")


@pytest.mark.parametrize(
    "runbook",
    sorted(p for p in RUNBOOKS.glob("*.md") if ON_CALL_COMMAND.search(p.read_text())),
    ids=lambda p: p.name,
)
def test_a_runbook_showing_on_call_commands_says_they_rely_on_the_default_config(
    runbook: Path,
) -> None:
    text = " ".join(runbook.read_text().split())
    assert str(DEFAULT_CONFIG_FILE) in text and f"${CONFIG_ENV}" in text
    assert "--config.file FILE" in text and "remediator's host" in text
    assert "refuse" in text and "--force" in text
