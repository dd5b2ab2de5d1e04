"""The alerting rules: valid for promtool, unit-tested alert by alert, mixin-styled, linked to
runbooks that exist, and built only on the metric contract."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlx_medic.remediator.config import RoutingConfig
from tests.promql_names import (
    contract_sections,
    metric_names,
    unknown_metrics,
)
from tests.tools import require_tool

RULES_DIR = Path(__file__).resolve().parent.parent / "alerting-rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yaml"))
UNIT_TESTS = sorted((RULES_DIR / "tests").glob("*.yaml"))
RUNBOOKS = RULES_DIR / "runbooks"
RUNBOOK_PATTERN = "https://github.com/mlx-medic/mlx-medic/blob/main/alerting-rules/runbooks/{}.md"
SEVERITIES = {"critical", "warning", "info"}


def _alerts() -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            alerts.extend(rule for rule in group["rules"] if "alert" in rule)
    return alerts


ALERTS = _alerts()
ALERT_IDS = [alert["alert"] for alert in ALERTS]


def _rule_tests() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def test_there_are_rule_files_and_unit_tests_to_check() -> None:
    assert RULE_FILES and UNIT_TESTS and len(ALERTS) >= 15


def test_promtool_accepts_every_rule_file() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", *map(str, RULE_FILES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, UNIT_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_names_are_unique_and_camel_case() -> None:
    assert len(set(ALERT_IDS)) == len(ALERT_IDS)
    for name in ALERT_IDS:
        assert re.fullmatch(r"(?:[A-Z][A-Za-z0-9]*)+", name), name


@pytest.mark.parametrize("alert", ALERTS, ids=ALERT_IDS)
def test_every_alert_has_a_severity_a_static_summary_and_a_templated_description(
    alert: dict[str, Any],
) -> None:
    assert alert["labels"]["severity"] in SEVERITIES
    annotations = alert["annotations"]
    summary = annotations["summary"]
    assert summary.endswith(".") and "{{" not in summary, summary
    description = annotations["description"].strip()
    assert description
    # absent() has no labels to name and no meaningful value; every other alert says which.
    if not alert["expr"].lstrip().startswith("absent("):
        assert "{{ $labels." in description or "{{ $value" in description, description


@pytest.mark.parametrize("alert", ALERTS, ids=ALERT_IDS)
def test_every_runbook_url_follows_the_pattern_and_its_page_exists(
    alert: dict[str, Any],
) -> None:
    slug = alert["alert"].lower()
    assert alert["annotations"]["runbook_url"] == RUNBOOK_PATTERN.format(slug)
    page = RUNBOOKS / f"{slug}.md"
    assert page.is_file(), f"missing runbook {page}"
    text = page.read_text(encoding="utf-8")
    assert text.startswith(f"# {alert['alert']}\n")
    assert "mlx-medic resume" in text or "Nothing is paused" in text or "Nothing to resume" in text


def test_every_runbook_page_belongs_to_an_alert() -> None:
    pages = {page.stem for page in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == {name.lower() for name in ALERT_IDS}


@pytest.mark.parametrize("alert", ALERTS, ids=ALERT_IDS)
def test_every_metric_in_the_rules_is_in_the_metric_contract(alert: dict[str, Any]) -> None:
    names = metric_names(alert["expr"])
    assert names, f"no metric found in {alert['expr']!r}"
    assert not unknown_metrics(names), f"{alert['alert']} uses {unknown_metrics(names)}"


def test_every_alert_is_unit_tested_both_firing_and_quiet() -> None:
    cases = _rule_tests()
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert set(ALERT_IDS) - firing == set(), "alerts never tested firing"
    assert set(ALERT_IDS) - quiet == set(), "alerts never tested quiet"


def test_every_expected_alert_in_the_unit_tests_checks_its_annotations() -> None:
    for case in _rule_tests():
        for expected in case.get("exp_alerts") or []:
            assert {"summary", "description", "runbook_url"} <= set(expected["exp_annotations"])
            assert "severity" in expected["exp_labels"]


def test_the_alert_the_remediator_routes_on_exists_and_keeps_its_model_label() -> None:
    routing = RoutingConfig()
    by_name = {alert["alert"]: alert for alert in ALERTS}
    for alertname in routing.playbooks:
        assert alertname in by_name, f"the remediator routes on {alertname}, no rule fires it"
    assert by_name["LLMModelDown"]["labels"]["severity"] == "critical"
    # The orphan alert carries the node whose orphans sweep-orphans removes.
    assert routing.playbooks["MLXOrphanProcesses"] == "sweep-orphans"
    assert "node" in by_name["MLXOrphanProcesses"]["expr"]
    # The survivors' alert is per node (reboot-node): it names the node, and the models there.
    assert routing.playbooks["MLXUnkillableSurvivors"] == "reboot-node"
    per_node = {"MLXUnkillableSurvivors"}
    fired = [
        (case["alertname"], expected["exp_labels"])
        for case in _rule_tests()
        if case["alertname"] in routing.playbooks
        for expected in case.get("exp_alerts") or []
    ]
    assert fired and {name for name, _ in fired} >= per_node
    assert all(routing.model_label in labels for name, labels in fired if name not in per_node)
    assert all({"node", "models"} <= set(labels) for name, labels in fired if name in per_node)


def _reads_exporter_series(alert: dict[str, Any]) -> bool:
    """Exporter names: those under the contract's exporter heading."""
    exporter = set(contract_sections()["exporter"])
    return bool(metric_names(alert["expr"]) & exporter)


EXPORTER_ALERTS = [a for a in ALERTS if _reads_exporter_series(a)]


@pytest.mark.parametrize("alert", EXPORTER_ALERTS, ids=[a["alert"] for a in EXPORTER_ALERTS])
def test_alerts_on_exporter_series_keep_the_node_and_name_it(alert: dict[str, Any]) -> None:
    """Every exporter series carries `node` (the inventory's name): aggregations keep it and
    the description names it, never the scrape address."""
    expr = alert["expr"]
    for grouped in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        assert "node" in {label.strip() for label in grouped.split(",")}, expr
    assert "without" not in expr and "instance" not in expr, expr
    description = alert["annotations"]["description"]
    assert "$labels.instance" not in description
    if not expr.lstrip().startswith("absent("):
        assert "{{ $labels.node }}" in description, description


def test_the_metric_scanner_reads_names_and_skips_functions_labels_and_durations() -> None:
    expr = (
        'sum by (node, model) (increase(mlx_log_errors_total{signature="x"}[10m])) > 0 '
        "or up offset 1h unless on (job) mlx_model_up == 0"
    )
    assert metric_names(expr) == {"mlx_log_errors_total", "up", "mlx_model_up"}
    assert unknown_metrics({"mlx_medic_remediation_duration_seconds_bucket", "up"}) == set()
    assert unknown_metrics({"mlx_made_up_total"}) == {"mlx_made_up_total"}


# --- the reboot alert, from the series the node's own exporter scrapes ---------------------

SURVIVOR_INVENTORY = """\
nodes:
  ai001: {{ssh: 192.168.101.1}}
  ai002: {{ssh: 192.168.101.2}}
models:
  glm-4_6-5b:
    model: /models/glm
    nodes: [ai001, ai002]
    port: 8080
    service: {{manager: supervisord, label: glm}}
    backends: {{jaccl: {{hostfile: {hostfile}}}, ring: {{hostfile: /etc/ring.json}}}}
  qwq-32b-8bit:
    model: /models/qwq
    nodes: [ai002]
    port: 8081
    service: {{manager: supervisord, label: qwq}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
"""


def scraped_ledger_series(tmp_path: Path, pid: int, started: float) -> list[str]:
    """The ledger collector's exposition on ai002, its own child recorded as a survivor of
    SIGKILL on two RDMA devices, as promtool input series (the scrape's job and instance
    labels added, as Prometheus adds them)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from mlx_medic.exporter.collector import ExporterContext, ScrapeCollector
    from mlx_medic.exporter.collectors.ledger import LedgerCollector
    from mlx_medic.inventory.load import parse_inventory
    from mlx_medic.state.ledger import record_spend

    hostfile = tmp_path / "glm-jaccl.json"
    hostfile.write_text(
        '[{"ssh": "ai001", "rdma": [null, "rdma_en2"]},'
        ' {"ssh": "ai002", "rdma": ["rdma_en2", null]}]'
    )
    record_spend(
        tmp_path,
        "ai002",
        "unkillable",
        pid=pid,
        start_time=started,
        devices=["rdma_en2", "rdma_en3"],
        backend="jaccl",
        model="glm-4_6-5b",
        cmdline=["python", "-m", "mlx_lm.server"],
        boot_id="b1",
    )
    inventory = parse_inventory(SURVIVOR_INVENTORY.format(hostfile=hostfile))
    context = ExporterContext(node="ai002", inventory=inventory, state_dir=tmp_path)
    registry = CollectorRegistry()
    registry.register(ScrapeCollector([LedgerCollector(context, lambda: "b1")], node="ai002"))
    exposition = generate_latest(registry).decode()
    target = 'instance="192.168.101.2:10900",job="mlx-medic-exporter",'
    series = []
    for line in exposition.splitlines():
        if not line or line.startswith("#") or line.startswith("mlx_medic_collector"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, labels = name_labels.split("{", 1) if "{" in name_labels else (name_labels, "}")
        series.append(f"{name}{{{target}{labels}")
        series.append(f"{float(value):g}x10")
    return series


SURVIVORS_SUMMARY = "Processes on a node survive SIGKILL; only a reboot of the node ends them."
SURVIVORS_DESCRIPTION = (
    "reboot ai002 to free 2 protection domain(s) (models placed there: glm-4_6-5b,"
    " qwq-32b-8bit): 1 process(es) there survive SIGKILL in uninterruptible sleep, as a sweep"
    " recorded them in the node's ledger. Starts go on around them (JACCL while each device"
    " they need is below the reserve, else ring); only one holding a model's port stops that"
    " model's start. This node's reboot is enough: its own survivors hold the domains"
    " (mlx-medic drain, reboot, mlx-medic undrain). Reboot every node of a model (seed 004)"
    " only when JACCL still fails on every start after each of its nodes was rebooted once."
)


def test_the_reboot_alert_fires_from_the_series_the_ledger_collector_scrapes(
    tmp_path: Path,
) -> None:
    import psutil

    promtool = require_tool("promtool")
    child = subprocess.Popen(["sleep", "600"])
    try:
        started = psutil.Process(child.pid).create_time()
        flat = scraped_ledger_series(tmp_path, child.pid, started)
    finally:
        child.kill()
        child.wait()
    pairs = list(zip(flat[::2], flat[1::2], strict=True))
    names = {series.split("{")[0] for series, _ in pairs}
    assert {
        "mlx_unkillable_processes",
        "mlx_unkillable_domains",
        "mlx_node_models_info",
        "mlx_pd_device_debt",
        "mlx_pd_debt",
        "mlx_pd_reserve",
    } <= names
    assert (
        'mlx_unkillable_domains{instance="192.168.101.2:10900",job="mlx-medic-exporter",'
        'model="glm-4_6-5b",node="ai002"}',
        "2x10",
    ) in pairs
    url = RUNBOOK_PATTERN.format("mlxunkillablesurvivors")
    unit = {
        "rule_files": [str(RULE_FILES[0])],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in pairs],
                "alert_rule_test": [
                    {"eval_time": "0m", "alertname": "MLXUnkillableSurvivors", "exp_alerts": []},
                    {
                        "eval_time": "3m",
                        "alertname": "MLXUnkillableSurvivors",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "node": "ai002",
                                    "models": "glm-4_6-5b,qwq-32b-8bit",
                                },
                                "exp_annotations": {
                                    "summary": SURVIVORS_SUMMARY,
                                    "description": SURVIVORS_DESCRIPTION,
                                    "runbook_url": url,
                                },
                            }
                        ],
                    },
                    # the same scrape: the device debt of the survivor, below glm's reserve of 5
                    {"eval_time": "3m", "alertname": "MLXPDDebtAtReserve", "exp_alerts": []},
                ],
            }
        ],
    }
    path = tmp_path / "scraped.yaml"
    path.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- the runbooks' mlx-medic command lines are real ones -----------------------------------

ROOT = RULES_DIR.parent
# Every page on-call reads a command from: every runbook, and the ring fallback guide.
COMMAND_PAGES = (*sorted(RUNBOOKS.glob("*.md")), ROOT / "docs" / "ring-fallback.md")
PLACEHOLDERS = {
    "MODEL": "glm-4_6-5b",
    "NODE": "ai002",
    "INVENTORY": "/etc/mlx-medic/inv.yaml",
    "FILE": "/etc/mlx-medic/remediator.yml",
    "WHY": "why",
    "TEXT": "text",
    "HOST": "127.0.0.1",
    "PORT": "8080",
    "NAME": "oncall",
}
MLX_MEDIC = ROOT / ".venv" / "bin" / "mlx-medic"


def page_commands(path: Path) -> list[list[str]]:
    """The words after `mlx-medic` of every `mlx-medic ...` span on the page, placeholders
    replaced."""
    text = " ".join(path.read_text(encoding="utf-8").split())
    found = []
    for span in re.findall(r"`((?:sudo )?mlx-medic [^`]+)`", text):
        if "..." in span:
            continue  # an elision (`mlx-medic node ...`) or a quoted log line, no command
        words = [PLACEHOLDERS.get(w, w) for w in span.split()]
        found.append(words[words.index("mlx-medic") + 1 :])
    return found


def runbook_commands(slug: str) -> list[list[str]]:
    return page_commands(RUNBOOKS / f"{slug}.md")


def command_lines(path: Path) -> list[list[str]]:
    """A span that names a bare subcommand (`mlx-medic pause`) is prose, not a command line."""
    return [words for words in page_commands(path) if len(words) > 1]


def test_every_runbook_is_a_command_page_and_the_pages_show_command_lines() -> None:
    assert {p.name for p in RUNBOOKS.glob("*.md")} <= {p.name for p in COMMAND_PAGES}
    assert all(p.is_file() for p in COMMAND_PAGES)
    assert sum(len(command_lines(p)) for p in COMMAND_PAGES) > 50


def parsed_command(words: list[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """The namespace and the parser that has the command's own options (a node helper's
    words by the helper's own parser, as `mlx-medic node` parses them); SystemExit when the
    words do not parse."""
    from mlx_medic.cli import COMMANDS, parse_args
    from mlx_medic.node.cli import HELPERS

    args = parse_args(words)
    if args.command == "node":
        parser = argparse.ArgumentParser(prog=f"mlx-medic node {args.helper}")
        importlib.import_module(HELPERS[args.helper][0]).add_arguments(parser)
        parser.parse_args(args.helper_args)
        return args, parser
    parser = argparse.ArgumentParser(prog=f"mlx-medic {args.command}")
    importlib.import_module(COMMANDS[args.command].module).add_arguments(parser)
    return args, parser


@pytest.mark.parametrize("path", COMMAND_PAGES, ids=lambda p: p.name)
def test_every_mlx_medic_command_line_in_the_runbook_parses(path: Path) -> None:
    """Each one as the mlx-medic command parses it: an option that does not exist or a
    missing argument fails here. A page that shows no command line is fine."""
    for words in command_lines(path):
        try:
            parsed_command(words)
        except SystemExit as exc:
            raise AssertionError(
                f"{path.name}: `mlx-medic {' '.join(words)}` does not parse (exit {exc.code})"
            ) from None


# `remediate` needs a remediator's config and journal, not an inventory (its dry run is run
# by tests/remediator/test_cli.py): it is run with --help here.
NEEDS_A_CLUSTER = ("remediate",)
# Commands that find the remediator's config (here by $MLX_MEDIC_CONFIG), not an inventory.
READ_THE_REMEDIATOR_CONFIG = ("journal",)


def how_to_run(words: list[str], inventory: Path) -> list[str]:
    """The words to run for real: with `--dry-run` where the command has that option (it
    would act), the inventory being `inventory`; else with `--help`."""
    try:
        args, parser = parsed_command(words)
    except SystemExit:
        return [*words, "--help"]  # the parse test names it; --help still must not crash
    acts = "--dry-run" in parser._option_string_actions
    if not acts or args.command in NEEDS_A_CLUSTER:
        return [*words, "--help"]
    run = list(words)
    if args.command in READ_THE_REMEDIATOR_CONFIG:
        pass
    elif "--inventory" in run:
        run[run.index("--inventory") + 1] = str(inventory)
    else:
        run += ["--inventory", str(inventory)]
    return run if "--dry-run" in run else [*run, "--dry-run"]


RUN_INVENTORY = Path("<the test's inventory>")  # replaced by the fixture's when run


def distinct_command_lines() -> list[tuple[str, ...]]:
    """Every line as it is run (`how_to_run`), each once."""
    return list(
        dict.fromkeys(
            tuple(how_to_run(w, RUN_INVENTORY)) for p in COMMAND_PAGES for w in command_lines(p)
        )
    )


@pytest.fixture(scope="module")
def command_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The example inventory with a state dir of its own, on node ai002 (NODE), and a
    remediator config naming it with a journal of its own."""
    import os

    home = tmp_path_factory.mktemp("runbook-commands")
    state = home / "state"
    state.mkdir()
    (state / "node-id").write_text("ai002\n")
    inventory = home / "inventory.yaml"
    text = (ROOT / "examples" / "inventory.yaml").read_text(encoding="utf-8")
    inventory.write_text(re.sub(r"^state_dir: .*$", f"state_dir: {state}", text, flags=re.M))
    config = home / "remediator.yml"
    config.write_text(f"inventory: {inventory}\njournal: {home / 'journal.sqlite'}\n")
    env = {**os.environ, "HOME": str(home), "MLX_MEDIC_CONFIG": str(config)}
    return inventory, env


@pytest.mark.parametrize("run", distinct_command_lines(), ids=" ".join)
def test_every_mlx_medic_command_line_in_the_runbooks_runs(
    run: tuple[str, ...], command_env: tuple[Path, dict[str, str]]
) -> None:
    """Run for real, one process per distinct line: a command that would act with
    `--dry-run` (the sweep and the clean, on this machine as node ai002 of the example
    inventory), any other with `--help`: exit 0 and no traceback, so a command that parses
    but crashes is caught too."""
    inventory, env = command_env
    argv = [str(inventory) if w == str(RUN_INVENTORY) else w for w in run]
    if not MLX_MEDIC.exists():
        pytest.skip(f"{MLX_MEDIC} is not installed (scripts/test.sh makes the venv)")
    result = subprocess.run(
        [str(MLX_MEDIC), *argv], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    said = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in said, (
        f"`mlx-medic {' '.join(argv)}`: exit {result.returncode}\n{said[-2000:]}"
    )


def test_a_command_that_would_act_is_run_dry_and_the_others_ask_for_help(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    assert how_to_run(["node", "sweep", "m", "--inventory", "/x"], inventory) == [
        "node",
        "sweep",
        "m",
        "--inventory",
        str(inventory),
        "--dry-run",
    ]
    assert how_to_run(["node", "clean", "m", "--dry-run"], inventory) == [
        "node",
        "clean",
        "m",
        "--dry-run",
        "--inventory",
        str(inventory),
    ]
    assert how_to_run(["node", "ledger", "--node", "ai002"], inventory)[-1] == "--help"
    assert how_to_run(["remediate", "m"], inventory) == ["remediate", "m", "--help"]
    assert how_to_run(["pause", "m"], inventory) == ["pause", "m", "--help"]


def test_the_survivor_runbook_shows_how_to_check_the_ledger_and_the_orphans() -> None:
    commands = [" ".join(words) for words in runbook_commands("mlxunkillablesurvivors")]
    assert "node ledger --inventory /etc/mlx-medic/inv.yaml --node ai002" in commands
    assert "node orphans glm-4_6-5b --inventory /etc/mlx-medic/inv.yaml" in commands
    text = " ".join((RUNBOOKS / "mlxunkillablesurvivors.md").read_text().split())
    for said in (
        "The sweep records each one in the node's protection-domain ledger",
        "start the model anyway",
        "else ring with `--pipeline`",
        "Only a survivor that listens on the model's port stops a start",
        "The ledger is per boot: a reboot empties it",
        "is lifted once",
        "One node's reboot is enough",
    ):
        assert said in text, said
    uninterruptible = " ".join(
        (RUNBOOKS / "mlxorphanprocessesuninterruptible.md").read_text().split()
    )
    assert "escalates before any sweep" not in uninterruptible
    assert "it does not escalate before a sweep" in uninterruptible


def distributed_config_parser() -> argparse.ArgumentParser:
    """`mlx.distributed_config`'s own argument parser, as installed (its main() builds it
    inline)."""
    config = pytest.importorskip("mlx._distributed_utils.config")

    class Built(Exception):
        pass

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        raise Built(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign,assignment]
    try:
        config.main()
    except Built as built:
        return built.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError("mlx.distributed_config's main() did not parse its arguments")


def test_the_ring_hostfile_command_of_the_fallback_guide_is_mlx_distributed_configs_own() -> None:
    """Seed 004's command, as docs/ring-fallback.md shows it, over Thunderbolt and over
    Ethernet, parses with the installed `mlx.distributed_config`: a flag it lacks fails."""
    text = (ROOT / "docs" / "ring-fallback.md").read_text(encoding="utf-8")
    found = re.search(r"^ {4}(mlx\.distributed_config .*?)\n\n", text, re.M | re.S)
    assert found, "docs/ring-fallback.md shows no mlx.distributed_config command"
    words = found[1].replace("\\\n", " ").split()[1:]
    parser = distributed_config_parser()
    args = parser.parse_args(words)
    assert (args.over, args.backend, args.auto_setup) == ("thunderbolt", "ring", True)
    assert args.hosts == "mac1,mac2,mac3,mac4" and args.output_hostfile.endswith("ring.json")
    assert "`--over ethernet`" in text
    ethernet = [("ethernet" if w == "thunderbolt" else w) for w in words]
    assert parser.parse_args(ethernet).over == "ethernet"
