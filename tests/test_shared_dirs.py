"""Tmp and cache dirs are one rule: weighed and cleaned alike, and a dir
several models on a node share is one dir, stale only past every sharing model's age."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from mlx_medic.check_config import shared_dirs_report
from mlx_medic.exporter.collector import ExporterContext
from mlx_medic.exporter.collectors import tmpdirs
from mlx_medic.exporter.collectors.tmpdirs import TmpWalker, WatchedDir
from mlx_medic.inventory.load import load_inventory, parse_inventory
from mlx_medic.platform.open_paths import PathsInUse
from mlx_medic.remediator.playbooks.recover import RecoverPlaybook
from mlx_medic.tmp_rules import ScopeDir, scope_dirs, stale_entries
from tests.exporter.test_tmpdirs_collector import age_tree, write

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "inventory.yaml"
REFERENCE = ROOT / "docs" / "inventory.md"
HF = Path("/Users/ai/.cache/huggingface/hub")


def two_models(share_a: Path, hf: Path) -> str:
    """Models a (n1, n2) and b (n2 only) share a Hugging Face cache: a names it in
    `tmp_dirs` and `cache_dirs`, b in `cache_dirs`, each spelled another way."""
    return f"""
nodes: {{n1: {{ssh: 127.0.0.2}}, n2: {{ssh: 127.0.0.3}}}}
models:
  a:
    model: m
    nodes: [n1, n2]
    port: 8080
    service: {{manager: supervisord, label: a}}
    backends: {{ring: {{hostfile: /etc/h.json}}}}
    tmp_dirs: [{share_a}, {hf}]
    cache_dirs: ['{hf}/']
    policy: {{stale_tmp_age: 30m}}
  b:
    model: m
    nodes: [n2]
    port: 8081
    service: {{manager: supervisord, label: b}}
    backends: {{ring: {{hostfile: /etc/h.json}}}}
    cache_dirs: ['{hf.parent}//./{hf.name}']
    policy: {{stale_tmp_age: 2h}}
"""


TWO_MODELS = two_models(Path("/srv/share/a"), Path("/srv/hf"))


def test_a_nodes_dirs_come_once_each_and_a_shared_one_takes_the_longest_stale_age():
    inventory = parse_inventory(TWO_MODELS)
    assert scope_dirs(inventory.models_on("n2")) == [
        ScopeDir(Path("/srv/share/a"), 1800, ("a",)),
        ScopeDir(Path("/srv/hf"), 7200, ("a", "b")),
    ]
    on_n1 = scope_dirs(inventory.models_on("n1"))
    assert on_n1[1] == ScopeDir(Path("/srv/hf"), 1800, ("a",))  # named twice by a alone
    assert [d.shared for d in on_n1] == [False, False]


def test_a_shared_dir_is_weighed_once_and_stale_only_past_every_sharing_models_age(tmp_path):
    """One series; an entry is stale only when no process uses it and it is older than
    the longest stale age of the models sharing the dir."""
    hf, share_a = tmp_path / "hf", tmp_path / "share-a"
    now = time.time()
    for entry, age in [
        (hf / "tmp_one_hour", 3600),
        (hf / "tmp_three_hours", 3 * 3600),
        (hf / "tmp_in_use", 3 * 3600),
        (share_a / "tmp_one_hour", 3600),
    ]:
        write(entry / "blob", 40_000)
        age_tree(entry, now - age)  # one hour: past a's 30m, not b's 2h
    inventory = parse_inventory(two_models(share_a, hf))
    on_n2 = tmpdirs.watched_dirs(ExporterContext(node="n2", inventory=inventory))
    assert on_n2 == [WatchedDir(share_a, 1800), WatchedDir(hf, 7200)]

    user = subprocess.Popen(["sleep", "120"], cwd=hf / "tmp_in_use")  # a live process
    try:
        walk = TmpWalker(on_n2, launch_dirs=lambda: []).walk()
    finally:
        user.kill()
        user.wait()
    reports = {Path(r.path): r for r in walk.dirs}
    assert len(walk.dirs) == 2
    assert reports[hf].stale_entries == 1  # tmp_three_hours alone
    (three_hours,) = stale_entries(hf, now, 7200, PathsInUse({str(hf / "tmp_in_use")})).entries
    assert reports[hf].stale_bytes == three_hours.bytes
    assert reports[share_a].stale_entries == 1  # a's own dir: a's 30m alone


def test_check_config_says_which_dirs_are_shared_on_which_nodes_by_which_models():
    report = shared_dirs_report(parse_inventory(TWO_MODELS))
    assert report[1:] == ["  /srv/hf on n2: a, b (stale after 2h)"]
    alone = two_models(Path("/srv/share/a"), Path("/srv/hf")).replace("//./hf", "/b")
    assert shared_dirs_report(parse_inventory(alone)) == ["shared dirs: none"]


def test_check_config_names_the_examples_shared_hugging_face_cache():
    result = subprocess.run(
        [sys.executable, "-m", "mlx_medic.cli", "check-config", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"  {HF} on ai004: glm-4_6-5b, qwq-32b-8bit (stale after 10m)" in result.stdout


def test_the_reference_describes_the_shared_dir_check_config_finds_in_the_example():
    text = REFERENCE.read_text(encoding="utf-8")
    section = text.split("## Shared tmp and cache dirs", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())
    (line,) = shared_dirs_report(load_inventory(EXAMPLE))[1:]
    assert line.startswith(f"  {HF} on ai004") and f"`{HF}` on ai004" in section
    assert "older than every sharing model's `policy.stale_tmp_age`" in section


def test_the_planned_clean_step_covers_cache_dirs_as_the_exporter_weighs_them():
    inventory = parse_inventory(TWO_MODELS)
    plan = RecoverPlaybook().plan(inventory.model("b"), inventory)
    (clean,) = [d for d in (step.describe() for step in plan) if d.name == "clean-tmp"]
    assert clean.node == "n2" and clean.targets == ["/srv/hf/tmp*"]
