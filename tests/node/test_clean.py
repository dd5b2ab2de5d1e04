"""The clean: exactly the entries the shared staleness rule calls stale, each checked again
right before it goes, removed without following a symlink; mlx.launch's leftovers of dead
launches; bytes freed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.node.clean import Cleaner
from mlx_medic.platform.open_paths import PathsInUse
from mlx_medic.platform.weighers import PythonWeigher
from mlx_medic.state.node_identity import write_node_id
from mlx_medic.tmp_rules import scope_dirs

OLD = time.time() - 7200


def inventory(tmp: Path, shared: Path):
    return parse_inventory(f"""
state_dir: {tmp / "state"}
nodes:
  n1: {{ssh: 127.0.0.2}}
models:
  m1:
    model: /models/m1
    nodes: [n1]
    port: 8080
    service: {{manager: supervisord, label: m1}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
    tmp_dirs: [{tmp / "m1"}]
    cache_dirs: [{shared}]
    policy: {{stale_tmp_age: 10m}}
  m2:
    model: /models/m2
    nodes: [n1]
    port: 8081
    service: {{manager: supervisord, label: m2}}
    backends: {{ring: {{hostfile: /etc/ring.json}}}}
    cache_dirs: [{shared}]
    policy: {{stale_tmp_age: 3h}}
launch_temp_dirs: [{tmp / "launch"}]
""")


def aged(path: Path, when: float = OLD) -> Path:
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(Path(root) / name, (when, when), follow_symlinks=False)
    os.utime(path, (when, when), follow_symlinks=False)
    return path


def stale_dir(parent: Path, name: str, content: bytes = b"x" * 5000, when: float = OLD) -> Path:
    entry = parent / name
    entry.mkdir(parents=True)
    (entry / "part").write_bytes(content)
    return aged(entry, when)


def cleaner(tmp: Path, shared: Path, *, dry_run=False, in_use=PathsInUse, clock=time.time):
    inv = inventory(tmp, shared)
    return Cleaner(
        model=inv.model("m1"),
        node="n1",
        dirs=scope_dirs(inv.models_on("n1")),
        launch_dirs=[tmp / "launch"],
        dry_run=dry_run,
        clock=clock,
        in_use=in_use,
        weigher=PythonWeigher(),
    )


def test_only_stale_entries_go_and_a_symlink_inside_one_is_never_followed(tmp_path: Path):
    own, shared = tmp_path / "m1", tmp_path / "shared"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    stale = stale_dir(own, "tmpstale")
    (stale / "link").symlink_to(outside)
    aged(stale)
    fresh = own / "tmpfresh"
    fresh.mkdir()
    other = stale_dir(own, "weights")  # not tmp*: never an entry
    (own / "tmplink").symlink_to(outside)  # a symlink is never an entry
    # In the dir m2 shares (stale only after 3 h): two hours old is not stale yet.
    shared_entry = stale_dir(shared, "tmpshared")

    document = cleaner(tmp_path, shared).run().to_json()
    assert [r["path"] for r in document["removed"]] == [str(stale)]
    assert document["removed"][0]["kind"] == "stale_dir"
    assert document["bytes_freed"] == document["removed"][0]["bytes"] > 0
    assert not stale.exists()
    assert (outside / "precious").read_text() == "keep"
    assert fresh.exists() and other.exists() and shared_entry.exists()
    assert (own / "tmplink").is_symlink()


def test_an_entry_in_use_by_the_time_of_removal_is_kept(tmp_path: Path):
    own, shared = tmp_path / "m1", tmp_path / "shared"
    stale = stale_dir(own, "tmpbusy")
    looks = []

    def in_use() -> PathsInUse:  # unused when judged, in use when about to be removed
        looks.append(1)
        return PathsInUse({str(stale / "part")} if len(looks) > 1 else set())

    report = cleaner(tmp_path, shared, in_use=in_use).run()
    assert report.removed == [] and stale.exists()
    assert "a live process uses it" in report.skipped[0]["reason"]


def test_an_entry_changed_after_it_was_judged_is_kept(tmp_path: Path):
    own, shared = tmp_path / "m1", tmp_path / "shared"
    stale = stale_dir(own, "tmpchanged")
    looks = []

    def in_use() -> PathsInUse:  # a run writes into it between the judgement and removal
        looks.append(1)
        if len(looks) == 2:
            (stale / "new").write_text("fresh")
        return PathsInUse()

    report = cleaner(tmp_path, shared, in_use=in_use).run()
    assert report.removed == [] and (stale / "new").exists()
    assert "not stale" in report.skipped[0]["reason"]


def test_the_open_files_are_looked_at_once_to_judge_and_once_before_removing_for_all_dirs(
    tmp_path: Path,
):
    own, shared = tmp_path / "m1", tmp_path / "shared"
    stale = stale_dir(own, "tmpstale")
    shared_stale = stale_dir(shared, "tmpshared", when=time.time() - 4 * 3600)  # past 3 h
    looks = []

    def in_use() -> PathsInUse:  # each call is a walk of every process's open files
        looks.append(1)
        return PathsInUse()

    report = cleaner(tmp_path, shared, in_use=in_use).run()
    assert sorted(r["path"] for r in report.removed) == sorted([str(stale), str(shared_stale)])
    assert len(looks) == 2
    looks.clear()
    cleaner(tmp_path, shared, in_use=in_use, dry_run=True).run()
    assert len(looks) == 1


def test_a_dead_launchs_leftovers_go_whatever_their_age_and_young_unowned_files_stay(
    tmp_path: Path,
):
    launch = tmp_path / "launch"
    launch.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    hostfile = '[["127.0.0.2:5000"], ["127.0.0.3:5000"]]\n'
    (launch / "tmp.Dead000001").write_text(f"{dead.pid}\n")  # pid file, process gone: now
    (launch / "tmp.Live000001").write_text(f"{os.getpid()}\n")  # pid file, alive
    (launch / "tmp.Host000001").write_text(hostfile)  # no owner, old: a dead launch's
    old = time.time() - 600
    os.utime(launch / "tmp.Host000001", (old, old))
    (launch / "tmp.Young00001").write_text(hostfile)  # no owner yet: a launch under way
    (launch / "tmp.Other00001").write_text("someone else's\n")
    document = cleaner(tmp_path, tmp_path / "shared").run().to_json()
    removed = {Path(r["path"]).name for r in document["removed"]}
    assert removed == {"tmp.Dead000001", "tmp.Host000001"}
    assert {r["kind"] for r in document["removed"]} == {"launch_leftover"}
    assert sorted(p.name for p in launch.iterdir()) == [
        "tmp.Live000001",
        "tmp.Other00001",
        "tmp.Young00001",
    ]


def test_a_dry_run_lists_what_would_go_and_removes_nothing(tmp_path: Path):
    own = tmp_path / "m1"
    stale = stale_dir(own, "tmpdry")
    document = cleaner(tmp_path, tmp_path / "shared", dry_run=True).run().to_json()
    assert document["dry_run"] is True
    assert [r["path"] for r in document["removed"]] == [str(stale)] and stale.exists()


def test_clean_refuses_a_model_not_on_this_node_and_prints_the_json_contract(tmp_path: Path):
    from tests.node.inventories import two_models

    config = tmp_path / "inventory.yaml"
    launch = tmp_path / "launch"  # never the host's own temp dir
    launch.mkdir()
    config.write_text(
        two_models(str(tmp_path / "state"), m1=f"\n    tmp_dirs: [{tmp_path / 'm1'}]")
        + f"launch_temp_dirs: [{launch}]\n"
    )
    write_node_id(tmp_path / "state", "n1")
    stale = stale_dir(tmp_path / "m1", "tmpcli")

    def node(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mlx_medic.cli", "node", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )

    refused = node("clean", "m2", "--json", "--inventory", str(config))
    assert refused.returncode == 2 and "'m2'" in refused.stderr
    result = node("clean", "m1", "--json", "--inventory", str(config))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["schema"], document["command"], document["model"], document["node"]) == (
        1,
        "clean",
        "m1",
        "n1",
    )
    assert [r["path"] for r in document["removed"]] == [str(stale)] and not stale.exists()
    assert document["bytes_freed"] > 0 and document["dry_run"] is False
    assert "skipped" in document and document["not_ours"] == []  # root may remove anything
