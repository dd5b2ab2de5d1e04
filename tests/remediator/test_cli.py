"""The on-call commands: `mlx-medic log`, `remediate`, `pause`, `resume`, `journal prune`."""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import os
import pwd
import socket
import time
from pathlib import Path

import pytest
import yaml

from mlx_medic import backend_cli
from mlx_medic.cli import COMMANDS, parse_args
from mlx_medic.inventory.load import parse_inventory
from mlx_medic.remediator import cli_log, cli_remediate
from mlx_medic.remediator.alerts import Disposition
from mlx_medic.remediator.cli_common import cannot_write
from mlx_medic.remediator.config import RemediatorConfig
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.log_replicas import named
from mlx_medic.remediator.outcomes import RunOutcome
from mlx_medic.transport import LocalTransport
from tests.node.inventories import helper_inventory
from tests.remediator.engine_fakes import (
    MODEL,
    OTHER,
    alert,
    inventory_text,
    make_engine,
)


def cli(args: list[str]) -> int:
    parsed = parse_args(args)
    return importlib.import_module(COMMANDS[parsed.command].module).run(parsed)


def write_config(tmp_path: Path, inventory: str | None = None, **extra) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(  # its nodes' helpers (the lock's) run here with it
        inventory or inventory_text(tmp_path / "node-state", medic_config=inventory_file)
    )
    config = {
        "journal": str(tmp_path / "state" / "journal.sqlite"),
        "inventory": str(inventory_file),
        **extra,
    }
    path = tmp_path / "remediator.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def config_of(path: Path) -> RemediatorConfig:
    return RemediatorConfig.model_validate(yaml.safe_load(path.read_text()))


def fill_journal(tmp_path: Path, config_file: Path) -> None:
    """A dry run of MODEL and an escalated run of OTHER, through a real engine."""
    inventory = parse_inventory(Path(config_of(config_file).inventory).read_text())

    async def go() -> None:
        raw = yaml.safe_load(config_file.read_text())
        dry = RemediatorConfig.model_validate({**raw, "dry_run": True})
        engine = make_engine(dry, inventory, tmp_path=tmp_path)
        await engine.submit(alert("dry1", MODEL))
        await engine.wait_idle()
        await engine.close()
        failing = RemediatorConfig.model_validate(
            {**raw, "routing": {"playbooks": {"LLMModelDown": "unrecoverable"}}}
        )
        engine = make_engine(failing, inventory, tmp_path=tmp_path)
        await engine.submit(alert("bad1", OTHER))
        await engine.wait_idle()
        await engine.close()

    asyncio.run(go())


def test_log_prints_runs_steps_outcomes_and_the_next_action_within_100_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    fill_journal(tmp_path, config_file)
    assert cli(["log", "--config.file", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    lines = out.splitlines()
    assert lines[0].startswith(f"CIRCUIT OPEN: {OTHER} since")
    assert any(line.startswith("RUN ") and "OUTCOME" in line for line in lines)
    run2 = next(i for i, line in enumerate(lines) if line.startswith("#2 "))
    run1 = next(i for i, line in enumerate(lines) if line.startswith("#1 "))
    assert run2 < run1  # newest first
    assert "escalated" in lines[run2] and "alert bad1" in lines[run2]
    assert "planned (dry run)" in lines[run1]
    assert "NEXT: check that ai002 is up and answers SSH, reboot it if it hangs; then" in out
    assert f"`mlx-medic resume {OTHER}`" in out  # the engine's NEXT, on the default path
    assert "sudo -n /bin/launchctl bootout system/" in out  # the dry run's first command
    assert out.count("planned  ") >= 10  # every step of recover's plan
    assert "targets: " in out  # each step's targets, as the page shows them
    pin = next(i for i, line in enumerate(lines) if " pin-ring " in line)
    assert lines[pin].split()[4] == "-"  # a planned step did not run: no duration
    assert lines[pin + 1].strip() == "only if the start fails verification"
    assert f"      re-check: act: {MODEL} is still down: down" in lines


def test_log_json_holds_the_controls_and_every_run_with_its_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    fill_journal(tmp_path, config_file)
    assert cli(["log", "--config.file", str(config_file), "--json", "--model", MODEL]) == 0
    data = json.loads(capsys.readouterr().out)
    (run,) = data["runs"]
    assert run["model"] == MODEL and run["outcome"] == "planned" and run["dry_run"] is True
    assert run["steps"][1]["command"][:3] == ["sudo", "-n", "/bin/launchctl"]  # the stop
    assert {s["outcome"] for s in run["steps"]} == {"planned"}
    assert data["controls"] == []  # OTHER's circuit is not shown for MODEL


def test_log_since_leaves_out_older_runs_and_a_bad_duration_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    journal = Journal(config_of(config_file).journal)
    journal.create_run(
        model=MODEL,
        playbook="recover",
        trigger_kind="manual",
        owner="h:1",
        now=time.time() - 3 * 3600,
    )
    assert cli(["log", "--config.file", str(config_file), "--since", "2h"]) == 0
    assert "no remediation runs" in capsys.readouterr().out
    assert cli(["log", "--config.file", str(config_file), "--since", "yesterday"]) == 2
    assert "--since: 'yesterday' is not a duration" in capsys.readouterr().err


def test_log_shows_recent_decisions_such_as_resolved_and_repeats_of_a_firing_folded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    journal = Journal(config_of(config_file).journal)
    now = time.time()
    journal.add_event("started", now=now - 5, model=MODEL, fingerprint="fp1", run_id=1)
    for ago in (4, 3, 2):
        journal.add_event("duplicate", now=now - ago, model=MODEL, fingerprint="fp1")
    journal.add_event(
        "resolved",
        now=now - 1,
        model=MODEL,
        fingerprint="fp1",
        detail="alert resolved; the run had already started",
    )
    assert cli(["log", "--config.file", str(config_file)]) == 0
    decisions = capsys.readouterr().out.split("RECENT DECISIONS", 1)[1].splitlines()[1:]
    kinds = [line.split()[1] for line in decisions if line[:1].isdigit()]
    assert kinds == ["resolved", "duplicate", "started"]
    assert any(line.strip().startswith("×3 from ") for line in decisions)
    assert any("the run had already started" in line for line in decisions)
    assert all(len(line) <= 100 for line in decisions)


def test_log_names_the_trigger_of_a_start_up_run(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    run_id = journal.create_run(
        model=MODEL, playbook="finish-stop", trigger_kind="startup", owner="h:1", now=time.time()
    )
    run = journal.get_run(run_id)
    assert run is not None
    (header, *_) = cli_log.format_run(run)
    assert header.split()[3] == "start-up"


def test_log_follow_prints_a_run_again_when_it_changes(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    run_id = journal.create_run(
        model=MODEL, playbook="recover", trigger_kind="manual", owner="h:1", now=time.time()
    )
    out = io.StringIO()

    def between_rounds(_seconds: float) -> None:
        journal.start_run(run_id, time.time())
        journal.end_run(run_id, RunOutcome.SUCCEEDED, time.time(), "verified healthy on ring")

    cli_log.follow(
        named([journal]), None, None, 20, as_json=True, out=out, rounds=2, sleep=between_rounds
    )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["outcome"] for r in records if r["record"] == "run"] == ["queued", "succeeded"]


def test_log_follow_prints_decisions_as_they_are_made_beside_the_runs(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    now = time.time()
    journal.add_event("duplicate", now=now - 2, model=MODEL, fingerprint="fp1")
    out = io.StringIO()

    def between_rounds(_seconds: float) -> None:
        run_id = journal.create_run(
            model=OTHER, playbook="recover", trigger_kind="manual", owner="h:1", now=now - 1
        )
        journal.add_event("started", now=now - 1, model=OTHER, run_id=run_id)
        journal.add_event("duplicate", now=now, model=MODEL, fingerprint="fp1")

    cli_log.follow(
        named([journal]), None, None, 20, as_json=False, out=out, rounds=2, sleep=between_rounds
    )
    text = out.getvalue()
    decisions = [line.split()[2:4] for line in text.splitlines() if line.startswith("decision")]
    assert decisions == [["duplicate", MODEL], ["started", OTHER], ["duplicate", MODEL]]
    assert "×2 from " in text  # the repeat, again as its fold grew
    assert any(line.startswith("#1 ") and OTHER in line for line in text.splitlines())


def test_log_follow_json_gives_each_line_its_record_kind_and_iso_times(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    journal.create_run(
        model=MODEL, playbook="recover", trigger_kind="manual", owner="h:1", now=1796331929.5
    )
    journal.add_event("resolved", now=1796331930.0, model=MODEL, fingerprint="fp1")
    out = io.StringIO()
    cli_log.follow(
        named([journal]), None, None, 20, as_json=True, out=out, rounds=1, sleep=lambda _: None
    )
    run, decision = (json.loads(line) for line in out.getvalue().splitlines())
    assert run["record"] == "run" and run["queued_at"] == "2026-12-03T21:05:29Z"
    assert decision["record"] == "decision" and decision["time"] == "2026-12-03T21:05:30Z"


LONG_REASON = (
    "ai002 did not answer SSH within 10s on 127.0.0.2 port 22 while the sweep was ending"
    " the ranks of the model, so nothing was started: the protection domains it holds are"
    " unknown /var/lib/mlx-medic/state/glm-4_6-5b/runs/20261203T210529Z-a-very-long-run-id"
)
LONG_RECHECK = (
    "skip, undecided: could not confirm glm-4_6-5b is down: could not probe on ai001: cannot"
    " reach ai001 (ai@192.168.101.1:22): timed out (probed `mlx-medic node probe glm-4_6-5b`"
    " on the head ai001, over SSH)"
)
LONG_NEXT = (
    "check that ai002 is up and answers SSH, reboot it if it hangs; then resume the model"
    " with `mlx-medic resume glm-4_6-5b` and watch the next run in `mlx-medic log --follow`"
)


@pytest.mark.parametrize("columns", [60, 200])
def test_log_fits_the_terminal_width_and_never_cuts_the_reason_or_the_next_action(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    columns: int,
) -> None:
    config_file = write_config(tmp_path)
    journal = Journal(config_of(config_file).journal)
    run_id = journal.create_run(
        model=MODEL, playbook="recover", trigger_kind="manual", owner="h:1", now=time.time()
    )
    journal.end_run(run_id, RunOutcome.ESCALATED, time.time(), LONG_REASON, LONG_NEXT)
    journal.record_recheck(run_id, LONG_RECHECK)
    monkeypatch.setenv("COLUMNS", str(columns))
    assert cli(["log", "--config.file", str(config_file)]) == 0
    lines = capsys.readouterr().out.splitlines()
    path = LONG_REASON.split()[-1]
    assert all(len(line) <= columns or path in line for line in lines)
    recheck = next(i for i, line in enumerate(lines) if line.startswith("      re-check: "))
    why = next(i for i, line in enumerate(lines) if line.startswith("      why:  "))
    nxt = next(i for i, line in enumerate(lines) if line.startswith("      NEXT: "))
    assert " ".join(lines[recheck:why]).split()[1:] == LONG_RECHECK.split()  # never cut
    assert all(line.startswith(" " * 12) for line in lines[why + 1 : nxt])  # under the label
    assert " ".join(" ".join(lines[why:nxt]).split()[1:]) == LONG_REASON
    shown_next = " ".join(" ".join(lines[nxt:]).split()[1:])
    assert shown_next.startswith(LONG_NEXT)
    assert (
        "`mlx-medic resume glm-4_6-5b`" in lines[nxt]
        or any(  # a command stays whole
            "`mlx-medic resume glm-4_6-5b`" in line for line in lines[nxt:]
        )
    )
    if columns == 60:
        assert any(line.endswith("…") for line in lines)  # the table's columns are cut


def test_pause_and_resume_reach_a_running_engine_and_say_what_they_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path, routing={"playbooks": {"LLMModelDown": "succeeding"}})
    config = config_of(config_file)
    inventory = parse_inventory(Path(config.inventory).read_text())

    async def submit(fingerprint: str) -> Disposition:
        engine = make_engine(config, inventory, tmp_path=tmp_path)
        try:
            return await engine.submit(alert(fingerprint))
        finally:
            await engine.wait_idle()
            await engine.close()

    assert cli(["pause", "--config.file", str(config_file), MODEL]) == 0
    out = capsys.readouterr().out
    assert f"paused automatic remediation for {MODEL}" in out
    assert f"undo with: mlx-medic resume {MODEL} --config.file {config_file}" in out
    assert asyncio.run(submit("p1")) == Disposition.PAUSED
    assert cli(["pause", "--config.file", str(config_file), MODEL]) == 0
    assert "already paused" in capsys.readouterr().out
    assert cli(["resume", "--config.file", str(config_file), MODEL]) == 0
    assert f"cleared the pause of {MODEL}" in capsys.readouterr().out
    assert asyncio.run(submit("p2")) == Disposition.STARTED

    assert cli(["pause", "--config.file", str(config_file)]) == 0
    assert "for all models" in capsys.readouterr().out
    assert asyncio.run(submit("p3")) == Disposition.PAUSED
    assert cli(["resume", "--config.file", str(config_file)]) == 0
    assert "cleared the pause of all models" in capsys.readouterr().out


def test_resume_closes_an_open_circuit_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    Journal(config_of(config_file).journal).open_circuit(
        MODEL, reason="budget", next_action="reboot ai002", by_whom="r", now=1.0
    )
    assert cli(["resume", "--config.file", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert f"still circuit open: {MODEL}" in out
    assert f"`mlx-medic resume {MODEL} --config.file {config_file}`" in out
    assert cli(["resume", "--config.file", str(config_file), MODEL]) == 0
    assert f"closed the circuit of {MODEL}" in capsys.readouterr().out
    assert Journal(config_of(config_file).journal).controls() == []


def test_pause_of_a_model_not_in_the_inventory_is_refused_with_the_known_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    assert cli(["pause", "--config.file", str(config_file), "nope"]) == 2
    err = capsys.readouterr().err
    assert "no model 'nope'" in err and MODEL in err


def test_remediate_refuses_an_unknown_model_and_a_bad_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    assert cli(["remediate", "--config.file", str(config_file), "nope"]) == 2
    assert "no model 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("dry_run: maybe\n")
    assert cli(["remediate", "--config.file", str(bad), MODEL]) == 2
    assert "dry_run" in capsys.readouterr().err


@pytest.mark.testbed
def test_remediate_dry_run_plans_without_the_lock_even_while_another_holds_it(
    tmp_path: Path, clean_cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = clean_cluster
    model = {
        "name": "tiny",
        "model": "/models/tiny",
        "nodes": ["ai001", "ai002"],
        "port": 18081,
        "service": {"manager": "supervisord", "label": "tiny"},
        "backends": {"ring": {"hostfile": "/etc/ring.json", "pipeline": True}},
    }
    inventory_text = helper_inventory(cluster, [model], "remediate").read_text()
    config_file = write_config(tmp_path, inventory_text)
    inventory = parse_inventory(inventory_text)
    assert cli(["remediate", "--config.file", str(config_file), "tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "manual" in out and "planned (dry run)" in out and "supervisorctl stop tiny" in out
    lock = cluster.head.host_path(inventory.state_dir / "locks" / "tiny.lock")
    assert not lock.exists()

    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(
        json.dumps(
            {
                "host": "other-host",
                "pid": os.getpid(),
                "time": time.time(),
                "holder": "serve",
                "run_id": "r1",
                "expires": time.time() + 600,
            }
        )
    )
    assert cli(["remediate", "--config.file", str(config_file), "tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "planned (dry run)" in out and "lock: not taken (dry run)" in out
    assert json.loads(lock.read_text())["holder"] == "serve"  # left as it was
    (latest, first) = Journal(config_of(config_file).journal).list_runs()
    assert (latest.outcome, first.outcome) == ("planned", "planned")


# --- which journal: the service's, said on stderr, or a refusal ----------------------


def test_every_command_says_on_stderr_which_journal_and_config_it_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    journal = config_of(config_file).journal
    said = f"mlx-medic: journal {journal}"
    flag = ["--config.file", str(config_file)]
    assert cli(["pause", *flag, MODEL]) == 0
    assert capsys.readouterr().err.startswith(
        f"{said} (new), named by {config_file} (--config.file)"
    )
    for command in (["log"], ["log", "--json"], ["resume", MODEL], ["remediate", "nope"]):
        cli([command[0], *flag, *command[1:]])
        captured = capsys.readouterr()
        assert f"{said}, named by {config_file} (--config.file)" in captured.err, command
        assert said not in captured.out, command  # `log --json` stays JSON


def test_without_the_flag_the_config_comes_from_MLX_MEDIC_CONFIG(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = write_config(tmp_path)
    monkeypatch.setenv("MLX_MEDIC_CONFIG", str(config_file))
    assert cli(["pause", MODEL]) == 0
    captured = capsys.readouterr()
    assert f"named by {config_file} ($MLX_MEDIC_CONFIG)" in captured.err
    # The hint names the file: another shell may not have the variable.
    assert f"undo with: mlx-medic resume {MODEL} --config.file {config_file}" in captured.out
    (control,) = Journal(config_of(config_file).journal).controls()
    assert control.model == MODEL


def test_the_flag_wins_over_MLX_MEDIC_CONFIG(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = write_config(tmp_path / "chosen")
    other = write_config(tmp_path / "other")
    monkeypatch.setenv("MLX_MEDIC_CONFIG", str(other))
    assert cli(["pause", "--config.file", str(chosen)]) == 0
    assert f"named by {chosen} (--config.file)" in capsys.readouterr().err
    assert len(Journal(config_of(chosen).journal).controls()) == 1
    assert not config_of(other).journal.exists()


def test_MLX_MEDIC_CONFIG_naming_a_missing_file_is_refused_naming_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLX_MEDIC_CONFIG", str(tmp_path / "gone.yml"))
    assert cli(["pause", MODEL]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'gone.yml'} ($MLX_MEDIC_CONFIG)" in err and "No such file" in err


def test_a_config_that_does_not_name_the_journal_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded default journal is under the service user's home: not this user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    config_file = tmp_path / "remediator.yml"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(inventory_text(Path("/var/lib/mlx-medic")))
    config_file.write_text(yaml.safe_dump({"inventory": str(inventory)}))
    for command in (["pause", MODEL], ["pause"], ["resume"], ["log"], ["remediate", MODEL]):
        assert cli([command[0], "--config.file", str(config_file), *command[1:]]) == 2
        err = capsys.readouterr().err
        assert "does not name the journal" in err and "nothing was changed" in err, command
    assert not (tmp_path / "state-home").exists()

    config_file.write_text(
        yaml.safe_dump({"inventory": str(inventory), "journal": "state/journal.sqlite"})
    )
    assert cli(["pause", "--config.file", str(config_file)]) == 2
    assert "is relative to the service's working directory" in capsys.readouterr().err


def test_log_of_a_journal_that_does_not_exist_is_refused_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    assert cli(["log", "--config.file", str(config_file)]) == 2
    assert "no journal at" in capsys.readouterr().err
    assert not config_of(config_file).journal.exists()


# --- what the commands do: pause and resume check names, remediate respects a pause ---


def test_pause_with_an_unreadable_inventory_writes_the_pause_but_exits_1_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path, inventory="models: [not, a, mapping]\n")
    assert cli(["pause", "--config.file", str(config_file), MODEL]) == 1
    captured = capsys.readouterr()
    assert f"paused automatic remediation for {MODEL}" in captured.out
    assert "warning: the pause of" in captured.err and "could not be checked" in captured.err
    assert f"`mlx-medic pause --config.file {config_file}` pauses every model" in captured.err
    (control,) = Journal(config_of(config_file).journal).controls()
    assert control.model == MODEL


def test_resume_of_a_model_not_in_the_inventory_is_refused_when_nothing_was_paused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    assert cli(["resume", "--config.file", str(config_file), "nope"]) == 2
    err = capsys.readouterr().err
    assert "no model 'nope'" in err and MODEL in err


def test_who_acted_is_the_sudo_user_with_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUDO_USER", "alice")
    config_file = write_config(tmp_path)
    assert cli(["pause", "--config.file", str(config_file), MODEL]) == 0
    (control,) = Journal(config_of(config_file).journal).controls()
    assert control.by_whom == f"alice@{socket.gethostname()}"


def test_who_acted_without_sudo_is_the_account_of_the_real_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setenv("USER", "someone-else")  # the environment is not who ran it
    monkeypatch.setenv("LOGNAME", "someone-else")
    config_file = write_config(tmp_path)
    assert cli(["pause", "--config.file", str(config_file)]) == 0
    (control,) = Journal(config_of(config_file).journal).controls()
    person = f"{pwd.getpwuid(os.getuid()).pw_name}@{socket.gethostname()}"
    assert control.by_whom == person
    assert backend_cli.who() == f"{person} at a terminal"  # `mlx-medic backend` names them so


def test_remediate_of_a_paused_model_is_refused_without_force_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path)
    flag = ["--config.file", str(config_file)]
    for pause in ([MODEL], []):  # the model's pause, and the pause of every model
        assert cli(["pause", *flag, *pause, "--reason", "bob is on ai002"]) == 0
        capsys.readouterr()
        assert cli(["remediate", *flag, MODEL, "--dry-run"]) == 4
        err = capsys.readouterr().err
        assert f"{MODEL} is paused" in err and "bob is on ai002" in err and "--force" in err
        assert f"`mlx-medic resume {' '.join(pause + flag)}`" in err
        assert cli(["resume", *flag, *pause]) == 0
    assert Journal(config_of(config_file).journal).list_runs() == []


def test_remediate_force_of_a_paused_model_runs_and_journals_the_override(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_remediate, "SshTransport", lambda inventory: LocalTransport())
    monkeypatch.setenv("SUDO_USER", "alice")
    config_file = write_config(tmp_path)
    flag = ["--config.file", str(config_file)]
    assert cli(["pause", *flag, MODEL, "--reason", "bob is on ai002"]) == 0
    capsys.readouterr()
    assert cli(["remediate", *flag, MODEL, "--dry-run", "--force"]) == 0
    captured = capsys.readouterr()
    assert "planned (dry run)" in captured.out
    assert captured.err.startswith(f"mlx-medic: journal {config_of(config_file).journal},")
    assert "override journaled: " in captured.err
    journal = Journal(config_of(config_file).journal)
    (run,) = journal.list_runs()
    assert (run.model, run.trigger_kind, run.outcome) == (MODEL, "manual", "planned")
    (override,) = journal.list_events(kind="override")
    assert override.model == MODEL
    assert override.detail.startswith(
        f"alice@{socket.gethostname()} ran the playbook by hand with --force while"
    )
    assert "bob is on ai002" in override.detail
    assert journal.controls()[0].kind == "pause"  # --force overrides once; the pause stays


def test_remediate_dry_run_asks_no_node_so_a_misconfigured_one_does_not_stop_its_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_remediate, "SshTransport", lambda inventory: LocalTransport())
    unreadable = inventory_text(tmp_path / "node-state", medic_config=tmp_path / "absent.yaml")
    config_file = write_config(tmp_path, unreadable)
    assert cli(["remediate", "--config.file", str(config_file), MODEL, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "planned (dry run)" in out and "lock: not taken (dry run)" in out
    assert "re-check: no re-check: started by hand" in out


def test_remediate_exits_5_when_a_node_is_misconfigured_and_prints_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: the nodes' inventory is not at their medic_config, so the head's
    lock helper cannot read it; nothing was done (docs/exit-codes.md: 5)."""
    monkeypatch.setattr(cli_remediate, "SshTransport", lambda inventory: LocalTransport())
    absent = tmp_path / "etc" / "inventory.yaml"
    config_file = write_config(
        tmp_path, inventory_text(tmp_path / "node-state", medic_config=absent)
    )
    assert cli(["remediate", "--config.file", str(config_file), MODEL]) == 5
    out = capsys.readouterr().out
    assert "misconfigured" in out and "mlx-medic on ai001 cannot read its inventory" in out
    assert f"NEXT: nothing was done to {MODEL}: put the inventory at" in out
    (run,) = Journal(config_of(config_file).journal).list_runs()
    assert (run.outcome, run.steps) == (RunOutcome.MISCONFIGURED, [])


def test_a_journal_this_user_cannot_write_names_who_can_once() -> None:
    journal = Path("/var/lib/mlx-medic-remediator/journal.sqlite")
    nobody = pwd.getpwnam("nobody").pw_uid
    assert cannot_write(journal, "alice", nobody) == (
        f"cannot write the journal {journal} as alice: it belongs to nobody; run this as"
        " nobody, or as root (sudo), which writes as the journal's owner"
    )
    assert cannot_write(journal, "alice", 0) == (
        f"cannot write the journal {journal} as alice: it belongs to root; run this as root"
        " (with sudo)"
    )


def old_and_new_events(config_file: Path) -> Journal:
    journal = Journal(config_of(config_file).journal)
    journal.add_event(Disposition.ABSORBED, now=time.time() - 40 * 86400, model=MODEL)
    journal.add_event(Disposition.ABSORBED, now=time.time(), model=MODEL)
    return journal


def test_journal_prune_dry_run_says_what_it_would_delete_and_deletes_nothing_then_prune_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = write_config(tmp_path, journal_retention={"max_age": "30d"})
    journal = old_and_new_events(config_file)

    assert cli(["journal", "prune", "--dry-run", "--config.file", str(config_file)]) == 0
    assert "would delete 0 runs, 0 steps, 0 firings, 1 events" in capsys.readouterr().out
    assert len(journal.list_events()) == 2

    assert cli(["journal", "prune", "--config.file", str(config_file)]) == 0
    assert "deleted 0 runs, 0 steps, 0 firings, 1 events" in capsys.readouterr().out
    assert len(journal.list_events()) == 1


def test_journal_prune_with_an_unreadable_inventory_deletes_nothing_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the inventory the models' budget windows are unknown: their runs might go."""
    config_file = write_config(tmp_path, inventory="models: [not, a, mapping]\n")
    journal = old_and_new_events(config_file)
    assert cli(["journal", "prune", "--config.file", str(config_file)]) == 2
    assert "mlx-medic journal:" in capsys.readouterr().err
    assert len(journal.list_events()) == 2
