"""What a model costs a scrape: the series a whole in-process exporter scrape gains with one
more model, per family, on its head and on another node, as docs/metrics.md states it, and
never more than 30 on any node."""

from __future__ import annotations

import re
from pathlib import Path

from mlx_medic.processes.info import State
from tests.exporter.process_tables import launcher_argv, proc, rank_argv, ssh_client_argv, table
from tests.exporter.scrape_size import HEAD, PEER, model_cost, scrape, series_by_family

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
GOAL = 30  # issue 26: at most 30 series per model per node


def documented_cost() -> tuple[int, int, dict[str, tuple[int, int]]]:
    """(head, other node, per family) as docs/metrics.md's "What a model costs" says."""
    text = DOC.read_text(encoding="utf-8")
    said = re.search(r"costs (\d+) series on its head node and (\d+) on each other node", text)
    assert said, "docs/metrics.md no longer says what a model costs"
    section = text.split("## What a model costs", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| (\d+) \|$", section, re.MULTILINE)
    return int(said[1]), int(said[2]), {name: (int(h), int(o)) for name, h, o in rows}


def test_a_model_costs_what_docs_metrics_md_says_on_its_head_and_on_each_other_node(
    tmp_path: Path,
):
    head, other, table_ = documented_cost()
    on_head, on_peer = model_cost(tmp_path / "head", HEAD), model_cost(tmp_path / "peer", PEER)
    assert dict(on_head) == {name: h for name, (h, _) in table_.items() if h}
    assert dict(on_peer) == {name: o for name, (_, o) in table_.items() if o}
    assert (sum(on_head.values()), sum(on_peer.values())) == (head, other)


def test_a_model_costs_at_most_thirty_series_on_any_node(tmp_path: Path):
    for node in (HEAD, PEER):
        assert sum(model_cost(tmp_path / node, node).values()) <= GOAL


def test_orphans_and_running_processes_add_only_their_non_zero_breakdowns(tmp_path: Path):
    """A running model adds one series per role and state its processes are in, an orphan
    one per role, state and rule; the always-present orphan count only changes value."""
    quiet = series_by_family(scrape(tmp_path / "quiet", 1, PEER))
    serving = table(
        proc(1, 0, ["/sbin/launchd"]),
        proc(5, 1, launcher_argv(rank_argv(8081, "/models/m1"))),
        proc(10, 5, rank_argv(8081, "/models/m1"), env={"MLX_RANK": "0"}),
        proc(11, 5, ssh_client_argv("127.0.0.3", 1, rank_argv(8081, "/models/m1"))),
        proc(20, 1, rank_argv(8081, "/models/m1"), env={"MLX_RANK": "1"}, state=State.STOPPED),
    )
    families = scrape(tmp_path / "busy", 1, PEER, processes=serving)
    busy = series_by_family(families)
    busy.subtract(quiet)
    assert +busy == {"mlx_processes": 4, "mlx_orphan_processes_by_rule": 1}
    breakdown = {
        (sample.labels["role"], sample.labels["state"], sample.labels.get("rule"))
        for family in families
        if family.name in ("mlx_processes", "mlx_orphan_processes_by_rule")
        for sample in family.samples
    }
    assert breakdown == {
        ("launcher", "sleeping", None),
        ("rank", "sleeping", None),
        ("ssh_client", "sleeping", None),
        ("rank", "stopped", None),
        ("rank", "stopped", "launcher_gone"),
    }
