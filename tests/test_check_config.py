"""`mlx-medic check-config` checks either config file: the inventory or the remediator's own.

Both loaders say every problem at once with its line, column, field and value, name a
file of the other kind as such, and tell a file they could not read (exit 2) from one they
read and found wrong (exit 1). Without a flag check-config tells the kind by the file's
top-level keys; `--inventory` and `--config.file` say it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlx_medic.cli import main
from mlx_medic.config_kind import INVENTORY_KEYS, REMEDIATOR_KEYS, Detected, detect_kind
from mlx_medic.inventory.load import load_inventory, parse_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.inventory.schema import Inventory
from mlx_medic.remediator.config import (
    FLAG_FOUND_BY,
    ConfigError,
    ConfigFileError,
    ConfigSource,
    RemediatorConfig,
    read_config,
)
from tests.test_cli_dispatch import modules_loaded_by
from tests.test_inventory import EXAMPLE, GOOD


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n{GOOD}")  # no node-id of this host
    return path


def remediator_config(tmp_path: Path, inventory: Path, extra: str = "") -> Path:
    path = tmp_path / "remediator.yml"
    path.write_text(
        f"inventory: {inventory}\n"
        f"journal: {tmp_path / 'journal.sqlite'}\n"
        "auth: {bearer_token_file: /etc/mlx-medic/webhook.token}\n" + extra
    )
    return path


def check_config(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["check-config", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def config_problems(path: Path) -> ConfigFileError:
    with pytest.raises(ConfigFileError) as caught:
        read_config(ConfigSource(path, FLAG_FOUND_BY))
    return caught.value


# --- the remediator's config: every problem, with its place ----------------------------


def test_a_typo_and_a_bad_listen_are_both_reported_with_line_value_and_exit_1(
    tmp_path: Path, inventory: Path
) -> None:
    config = remediator_config(tmp_path, inventory, "dry_rn: true\nlisten: nowhere:80x\n")
    result = run_cli("check-config", config)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{config}: 2 problem(s)",
        "  line 4, column 1: dry_rn: true: unknown field (check the spelling)",
        "  line 5, column 1: listen: listen address 'nowhere:80x': '80x' is not a port",
    ]


def test_a_bad_value_the_message_does_not_quote_is_shown_as_the_file_wrote_it(
    tmp_path: Path, inventory: Path
) -> None:
    config = remediator_config(tmp_path, inventory, "dry_run: 'maybe'\nmax_body_bytes: 10\n")
    assert config_problems(config).problems == [
        "line 4, column 1: dry_run: 'maybe': Input should be a valid boolean, unable to"
        " interpret input",
        "line 5, column 1: max_body_bytes: 10: Input should be greater than or equal to 1024",
    ]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"listen: [\n", "line 2, column 1: not valid YAML: "),
        (b"# nothing yet\n", "the file is empty; "),
        (b"- inventory: x\n", "the top level must be a mapping"),
        (b"\xff\xfe\x00\x01", "not UTF-8 text: "),
        (b"listen: \x00\n", "not a text file: it has NUL bytes"),
    ],
)
def test_a_file_that_is_no_mapping_of_settings_is_said_as_the_inventory_says_it(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "remediator.yml"
    path.write_bytes(content)
    error = config_problems(path)
    assert len(error.problems) == 1 and error.problems[0].startswith(problem)
    assert not error.unreadable
    if not problem.startswith("the file is empty"):  # each kind says what it needs
        with pytest.raises(InventoryError) as caught:
            load_inventory(path)
        assert caught.value.problems[0].startswith(problem.split("; ")[0])


def test_the_service_stops_on_its_configs_problems_with_their_lines(tmp_path: Path) -> None:
    config = tmp_path / "remediator.yml"
    config.write_text("insecure_no_auth: true\ndry_rn: true\n")
    result = run_cli("remediator", "--config.file", config)
    assert result.returncode == 2
    assert f"mlx-medic remediator: config: {config}: 1 problem(s)\n" in result.stderr
    assert "  line 2, column 1: dry_rn: true: unknown field (check the spelling)" in result.stderr


def test_a_config_file_error_is_a_config_error_and_says_its_file() -> None:
    error = ConfigFileError("r.yml", ["line 1, column 1: dry_rn: true: unknown field"])
    assert isinstance(error, ConfigError)
    assert str(error) == "r.yml: line 1, column 1: dry_rn: true: unknown field"
    assert error.report() == "r.yml: 1 problem(s)\n  line 1, column 1: dry_rn: true: unknown field"


# --- telling the two kinds apart ---------------------------------------------------------


def test_the_kind_is_told_by_the_keys_only_one_kind_has() -> None:
    assert detect_kind({"nodes": {}, "models": {}}) == Detected("inventory", ("nodes", "models"))
    assert detect_kind({"inventory": "/i.yaml", "journal": "/j", "node": "a"}) == Detected(
        "remediator", ("inventory", "journal")
    )
    assert detect_kind({"nodes": {}, "journal": "/j"}) is None  # both
    assert detect_kind({"colour": "blue"}) is None  # neither
    assert detect_kind({"node": {"a": {}}}) is None  # `nodes` mistyped, not the remediator's


def test_the_deciding_keys_are_the_models_top_level_fields() -> None:
    assert set(INVENTORY_KEYS) == set(Inventory.model_fields)
    assert set(REMEDIATOR_KEYS) | {"node"} == set(RemediatorConfig.model_fields)


def test_the_inventory_loader_names_the_remediators_config_given_as_an_inventory(
    tmp_path: Path, inventory: Path
) -> None:
    config = remediator_config(tmp_path, inventory)
    with pytest.raises(InventoryError) as caught:
        load_inventory(config)
    assert caught.value.report().splitlines()[0] == (
        f"{config} looks like the remediator's config (it has inventory, journal, auth), not"
        f" an inventory; the inventory is the file its `inventory:` names ({inventory})"
    )


def test_the_config_loader_names_an_inventory_given_as_its_config(inventory: Path) -> None:
    error = config_problems(inventory)
    assert error.report().splitlines()[0] == (
        f"{inventory} looks like an inventory (it has state_dir, nodes, models), not the"
        f" remediator's config; the remediator's config names it with `inventory: {inventory}`"
    )


def test_an_inventory_that_only_mistypes_a_key_is_not_called_the_other_kind() -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(GOOD.replace("models:", "modles:"), "inv.yaml")
    assert caught.value.headline is None
    assert "line 4, column 1: modles: unknown field (check the spelling)" in caught.value.problems


# --- check-config: which file, which exit code -----------------------------------------


def test_a_valid_remediator_config_is_ok_with_what_it_names(
    tmp_path: Path, inventory: Path
) -> None:
    config = remediator_config(tmp_path, inventory)
    for flags in ([config], ["--config.file", config]):
        result = run_cli("check-config", *flags)
        assert result.returncode == 0, result.stderr
        assert result.stdout == (
            f"{config}: ok: remediator config (inventory {inventory}, journal"
            f" {tmp_path / 'journal.sqlite'}, listen 127.0.0.1:10901, 3 routes)\n"
        )


def test_an_inventory_is_detected_and_checked_as_before(
    capsys: pytest.CaptureFixture[str], inventory: Path
) -> None:
    for flags in ([inventory], ["--inventory", inventory]):
        code, out, _ = check_config(capsys, *flags)
        assert code == 0 and out.startswith(f"{inventory}: ok: 2 nodes, 1 models\n")


def test_checking_an_inventory_loads_nothing_of_the_remediator() -> None:
    code, loaded = modules_loaded_by("check-config", str(EXAMPLE))
    assert code == 0 and loaded == set()


def test_the_inventory_a_config_names_is_checked_and_its_problems_said_under_its_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, inventory: Path
) -> None:
    inventory.write_text(inventory.read_text().replace("port: 8080", "port: eighty"))
    config = remediator_config(tmp_path, inventory)
    code, out, err = check_config(capsys, config)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"{config}: 1 problem(s)",
        f"  inventory: {inventory} does not load (its problems follow)",
        f"{inventory}: 1 problem(s)",
        "  line 9, column 5: models.m.port: eighty: Input should be a valid integer, unable to"
        " parse string as an integer",
    ]


def test_a_config_whose_inventory_is_missing_or_routes_nowhere_lists_both(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = remediator_config(
        tmp_path, tmp_path / "gone.yaml", "routing: {playbooks: {LLMModelDown: mend}}\n"
    )
    code, _, err = check_config(capsys, config)
    assert code == 1
    assert err.splitlines() == [
        f"{config}: 2 problem(s)",
        "  routing.playbooks: LLMModelDown: unknown playbook 'mend' (playbooks: finish-stop,"
        " reboot-node, recover, sweep-orphans)",
        f"  inventory: {tmp_path / 'gone.yaml'}: cannot read: No such file or directory",
    ]


@pytest.mark.parametrize(
    "old, new, warning",
    [
        ("auth:", "# auth:", ["warning: auth: no credentials configured", "--insecure-no-auth"]),
        (
            "auth: {",
            "auth: {read_only_open: true, ",
            ["warning: auth.read_only_open: /, /api/* and /metrics are served to anyone"],
        ),
    ],
)
def test_no_credentials_or_reading_open_to_all_is_ok_with_a_warning(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    inventory: Path,
    old: str,
    new: str,
    warning: list[str],
) -> None:
    config = remediator_config(tmp_path, inventory)
    config.write_text(config.read_text().replace(old, new))
    code, out, err = check_config(capsys, config)
    assert code == 0 and ": ok: remediator config" in out
    assert all(part in err for part in warning)


def test_a_file_given_as_the_other_kind_is_named_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, inventory: Path
) -> None:
    config = remediator_config(tmp_path, inventory)
    code, out, err = check_config(capsys, "--inventory", config)
    assert code == 1 and out == ""
    assert err.startswith(f"{config} looks like the remediator's config (it has inventory,")
    code, out, err = check_config(capsys, "--config.file", inventory)
    assert code == 1 and out == ""
    assert err.startswith(f"{inventory} looks like an inventory (it has state_dir, nodes,")


@pytest.mark.parametrize("flag", [None, "--inventory", "--config.file"])
def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path, flag: str | None) -> None:
    missing = tmp_path / "missing.yml"
    result = run_cli("check-config", *([flag] if flag else []), missing)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"mlx-medic check-config: {missing}: cannot read: No such file or directory\n"
    )


def test_the_loaders_tell_a_file_they_could_not_read_from_one_they_found_wrong(
    tmp_path: Path,
) -> None:
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path)  # a directory
    assert caught.value.unreadable
    assert config_problems(tmp_path / "missing.yml").unreadable
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(bad)
    assert not caught.value.unreadable


def test_a_file_of_neither_kind_is_exit_2_naming_both_flags(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "what.yml"
    path.write_text(yaml.safe_dump({"colour": "blue"}))
    code, out, err = check_config(capsys, path)
    assert code == 2 and out == ""
    assert err == (
        f"mlx-medic check-config: {path}: its top-level keys (colour) are neither an"
        " inventory's (nodes, models, ...) nor the remediator's config's (inventory, journal,"
        f" ...); pass --inventory {path} or --config.file {path}\n"
    )
    path.write_text(yaml.safe_dump({"nodes": {}, "journal": "/j"}))
    code, _, err = check_config(capsys, path)
    assert code == 2 and "keys of both an inventory (nodes)" in err
    assert "(journal)" in err and "--inventory" in err and "--config.file" in err


def test_a_file_of_no_kind_that_is_no_yaml_mapping_is_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "empty.yml"
    path.write_text("")
    code, _, err = check_config(capsys, path)
    assert code == 1 and err == f"{path}: 1 problem(s)\n  the file is empty\n"


def test_one_file_at_a_time(capsys: pytest.CaptureFixture[str], inventory: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["check-config", str(inventory), "--config.file", str(inventory)])
    assert caught.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
