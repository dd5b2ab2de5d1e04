"""The metric contract (alerting-rules/metrics.txt): every name the rules and
dashboards rely on is really exported, under that exact name, by its one owner: the
exporter serves what a node records (each series naming its node), the remediator only
what it decides."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.remediator.auth import CredentialStore
from mlx_medic.remediator.config import AuthConfig, RemediatorConfig
from mlx_medic.remediator.engine import Engine
from mlx_medic.remediator.journal import Journal
from mlx_medic.remediator.journal_pruning import PruneMetrics
from mlx_medic.remediator.webapp import AlertsReceived
from mlx_medic.transport import LocalTransport
from tests.promql_names import contract_sections

REPO = Path(__file__).resolve().parents[1]
CONTRACT = [name for names in contract_sections().values() for name in names]
REMEDIATOR_NAMES = contract_sections()["remediator"]
EXPORTER_NAMES = contract_sections()["exporter"]
RDMA_NAMES = {"mlx_rdma_port_active", "mlx_rdma_objects"}  # macOS only: absent here


def inventory_text(tmp_path: Path, port: int = 1) -> str:
    for sub in ("tmp", "state"):
        (tmp_path / sub).mkdir(exist_ok=True)
    log = tmp_path / "m1.log"
    log.write_text("RuntimeError: [jaccl] Couldn't allocate protection domain\n")
    return f"""\
state_dir: {tmp_path / "state"}
launch_temp_dirs: [{tmp_path / "tmp"}]
nodes:
  n1: {{ssh: 127.0.0.1}}
models:
  m1:
    model: /models/m1
    nodes: [n1]
    port: {port}
    service: {{manager: supervisord, label: m1}}
    backends: {{ring: {{hostfile: /etc/ring.json, pipeline: true}}}}
    serve: {{memory_needed: 1GiB}}
    tmp_dirs: [{tmp_path / "tmp"}]
    log_files: [{log}]
"""


def exported_names(exposition: str) -> set[str]:
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}


def scrape_once(tmp_path: Path) -> str:
    config = tmp_path / "inventory.yaml"
    config.write_text(inventory_text(tmp_path))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_medic.cli",
            "exporter",
            "--once",
            "--inventory",
            str(config),
            "--node",
            "n1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_exporter_exports_every_contract_name_but_the_macos_only_rdma_ones(
    tmp_path: Path,
) -> None:
    exposition = scrape_once(tmp_path)
    names = exported_names(exposition)
    # counters are typed without their _total suffix in the exposition
    names |= {f"{n}_total" for n in names}
    missing = [n for n in EXPORTER_NAMES if n not in names and n not in RDMA_NAMES]
    assert missing == []
    assert not RDMA_NAMES & names  # absent, never a fake zero, where there is no RDMA
    # Every series says which node it is from, by the inventory's name: rules aggregate
    # by it and nothing maps a scrape address back to a node.
    samples = [line for line in exposition.splitlines() if line and not line.startswith("#")]
    assert samples and [line for line in samples if 'node="n1"' not in line] == []


def remediator_names(tmp_path: Path) -> set[str]:
    registry = CollectorRegistry()
    inventory = parse_inventory(inventory_text(tmp_path))
    journal = Journal(tmp_path / "journal.sqlite")
    Engine(
        RemediatorConfig(journal=tmp_path / "journal.sqlite", dry_run=True),
        inventory,
        journal,
        LocalTransport(),
        registry=registry,
    )
    names = exported_names(generate_latest(registry).decode())
    return {n for n in names if not n.endswith("_created")}


def service_names(tmp_path: Path) -> set[str]:
    """The series the service adds beside the engine's: the journal's size and prunes."""
    registry = CollectorRegistry()
    PruneMetrics(registry, tmp_path / "journal.sqlite")
    names = exported_names(generate_latest(registry).decode())
    return {n for n in names if not n.endswith("_created")}


def test_the_remediator_registers_every_contract_name(tmp_path: Path) -> None:
    names = remediator_names(tmp_path)
    names |= {f"{n}_total" for n in names}
    engine_names = [n for n in REMEDIATOR_NAMES if n != "mlx_medic_alerts_received_total"]
    assert [n for n in engine_names if n not in names] == []


def test_the_remediator_serves_only_what_it_decides(tmp_path: Path) -> None:
    """No node-recorded series (protection-domain debt is the exporter's, from the node's
    ledger), and the backend gauge says it is the last verified one."""
    assert remediator_names(tmp_path) - set(REMEDIATOR_NAMES) == set()


# The naming convention (docs/metrics.md): `mlx_<subject>` for what the exporter observes
# about the cluster, `mlx_medic_` for mlx-medic's own work (the remediator's series, the
# exporter's collectors).
EXPORTER_OWN = re.compile(r"mlx_medic_collector_\w+")
NAME = re.compile(r"[a-z][a-z0-9_]*")
NOT_YET_RENAMED: frozenset[str] = frozenset()  # none: every series follows the convention
RENAMED = {
    "mlx_medic_backend": "mlx_serve_backend",
    "mlx_medic_backend_pinned": "mlx_serve_backend_pinned",
    "mlx_medic_service_stopped_since_seconds": "mlx_service_stopped_since_seconds",
}
_FAMILY = re.compile(r"\b(Gauge|Counter|Histogram|Summary|Info)MetricFamily\(\s*\"(\w+)\"")
_NAMED = re.compile(r"\(\s*\"(mlx_\w+)\"")  # a name passed on to a family maker too
SUFFIX = {"Counter": "_total", "Info": "_info"}


def exporter_families() -> dict[str, str]:
    """Every family the exporter's code makes, as exposed (counters with `_total`): its
    kind. Read from the source, so the macOS-only series are here on Linux too."""
    found = {}
    for path in sorted((REPO / "exporter").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        found.update(dict.fromkeys(_NAMED.findall(text), "Gauge"))
        for kind, name in _FAMILY.findall(text):
            found.pop(name, None)
            found[name + SUFFIX.get(kind, "")] = kind
    return found


def follows_the_convention(name: str, kind: str, owner: str) -> list[str]:
    """What is wrong with the name, for its kind and owner; [] when nothing."""
    wrong = []
    if not NAME.fullmatch(name) or not name.startswith("mlx_"):
        wrong.append("is not mlx_ and snake case")
    ours = name.startswith("mlx_medic_")
    if owner == "remediator" and not ours:
        wrong.append("is the remediator's but does not start with mlx_medic_")
    if owner == "exporter" and ours and not EXPORTER_OWN.fullmatch(name):
        wrong.append("is about the cluster but starts with mlx_medic_")
    if (kind == "Counter") != name.endswith("_total"):
        wrong.append("ends in _total but is no counter, or is a counter without it")
    for unit in ("_seconds", "_bytes"):
        if unit in name and not name.endswith(unit):
            wrong.append(f"has {unit} but not last")
    return wrong


def test_the_source_names_every_family_a_real_scrape_serves(tmp_path: Path) -> None:
    served = {n.removesuffix("_total") for n in exported_names(scrape_once(tmp_path))}
    assert served - {n.removesuffix("_total") for n in exporter_families()} == set()


def test_every_exporter_series_follows_the_naming_convention() -> None:
    wrong = {
        name: problems
        for name, kind in exporter_families().items()
        if name not in NOT_YET_RENAMED
        and (problems := follows_the_convention(name, kind, "exporter"))
    }
    assert wrong == {}


def test_every_remediator_series_follows_the_naming_convention(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    Engine(
        RemediatorConfig(journal=tmp_path / "journal.sqlite", dry_run=True),
        parse_inventory(inventory_text(tmp_path)),
        Journal(tmp_path / "journal.sqlite"),
        LocalTransport(),
        registry=registry,
    )
    registry.register(AlertsReceived())
    PruneMetrics(registry, tmp_path / "journal.sqlite")
    token = tmp_path / "token"
    token.write_text("secret\n")
    registry.register(CredentialStore(AuthConfig(bearer_token_file=token)))  # type: ignore[arg-type]
    kinds = {family.name: family.type for family in registry.collect()}
    wrong = {
        name + ("_total" if kind == "counter" else ""): problems
        for name, kind in kinds.items()
        if name not in NOT_YET_RENAMED
        and (
            problems := follows_the_convention(
                name + ("_total" if kind == "counter" else ""), kind.capitalize(), "remediator"
            )
        )
    }
    assert wrong == {}


def test_every_contract_name_follows_the_naming_convention_for_its_owner() -> None:
    kinds = exporter_families()
    for owner, names in contract_sections().items():
        for name in names:
            kind = "Counter" if name.endswith("_total") else kinds.get(name, "Gauge")
            assert follows_the_convention(name, kind, owner) == [], name


def test_docs_metrics_md_names_every_series_and_maps_every_old_name_to_its_new_one(
    tmp_path: Path,
) -> None:
    doc = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    everything = set(exporter_families()) | remediator_names(tmp_path) | set(CONTRACT)
    served = {n + "_total" if f"{n}_total" in CONTRACT else n for n in everything}
    served |= service_names(tmp_path)
    assert [n for n in sorted(served) if f"`{n}`" not in doc] == []
    for old, new in RENAMED.items():
        assert f"| `{old}` | `{new}` |" in doc


def test_no_old_name_is_left_anywhere_but_in_the_list_of_renames() -> None:
    """A rename is done everywhere at once: code, rules, dashboards, tests, testbed,
    bench, runbooks, README."""
    listed = {REPO / "docs" / "metrics.md", Path(__file__).resolve()}
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    old = re.compile(r"\b(?:" + "|".join(map(re.escape, RENAMED)) + r")\b")
    left = [
        path
        for path in tracked
        if (REPO / path) not in listed
        and (REPO / path).is_file()
        and old.search((REPO / path).read_text(encoding="utf-8", errors="replace"))
    ]
    assert left == []
