"""A node helper reads the inventory from a snapshot of its validated form: the same
fields and answers as the validated models, without pydantic, and never a snapshot of
bytes the validator has not passed or one someone else could have written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mlx_medic.inventory.load import load_inventory
from mlx_medic.inventory.methods import InventoryError
from mlx_medic.inventory.snapshot import (
    KEEP,
    RECORDS,
    Record,
    default_cache_dir,
    load_cached_inventory,
    load_inventory_apart,
    read_snapshot,
    snapshot_key,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "inventory.yaml"
# Every kind of field: the seed's cluster and the few the example leaves at defaults.
RICH = EXAMPLE.read_text() + "launch_temp_dirs: [/private/var/folders/zz/T]\n"


def same(validated: Any, record: Any, where: str = "inventory") -> None:
    """`record` holds exactly what `validated` holds, field by field, with the same types."""
    if isinstance(validated, BaseModel):
        assert type(record) is RECORDS.get(type(validated).__name__, Record), where
        shared = [
            base
            for base in type(validated).__mro__
            if base.__module__ == "mlx_medic.inventory.methods"
        ]
        assert all(isinstance(record, base) for base in shared), where  # the same methods
        assert sorted(vars(record)) == sorted(type(validated).model_fields), where
        for name in type(validated).model_fields:
            same(getattr(validated, name), getattr(record, name), f"{where}.{name}")
    elif isinstance(validated, list):
        assert isinstance(record, list) and len(record) == len(validated), where
        for index, (a, b) in enumerate(zip(validated, record, strict=True)):
            same(a, b, f"{where}[{index}]")
    else:
        assert type(record) is type(validated) and record == validated, where


@pytest.fixture
def inventory_file(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(RICH)
    return path


def snapshots(cache: Path) -> list[Path]:
    return sorted(cache.glob("inventory-*.json"))


def test_the_first_load_validates_and_snapshots_and_the_second_reads_the_same_inventory(
    inventory_file: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = load_cached_inventory(inventory_file, cache)
    assert isinstance(first, BaseModel)  # validated in full
    assert len(snapshots(cache)) == 1
    second = load_cached_inventory(inventory_file, cache)
    assert isinstance(second, Record)
    same(load_inventory(inventory_file), second)


def test_records_answer_as_the_validated_models(inventory_file: Path, tmp_path: Path) -> None:
    validated = load_inventory(inventory_file)
    load_cached_inventory(inventory_file, tmp_path)
    record = load_cached_inventory(inventory_file, tmp_path)
    assert isinstance(record, Record)
    for name in ("glm-4_6-5b", "qwq-32b-8bit"):
        a, b = validated.model(name), record.model(name)
        assert (a.head, a.serve_flags(), a.scope_dirs()) == (
            b.head,
            b.serve_flags(),
            b.scope_dirs(),
        )
        assert [n for n, _ in a.backends.in_order()] == [n for n, _ in b.backends.in_order()]
        same(a.backends.in_order()[1][1], b.backends.in_order()[1][1])
        assert a.service.plist_path == b.service.plist_path
        assert a.process_patterns.compiled() == b.process_patterns.compiled()
    assert [m.name for m in record.models_on("ai004")] == ["glm-4_6-5b", "qwq-32b-8bit"]
    same(validated.node("ai003"), record.node("ai003"))
    with pytest.raises(KeyError):
        record.model("nope")


def test_a_record_is_read_only(inventory_file: Path, tmp_path: Path) -> None:
    load_cached_inventory(inventory_file, tmp_path)
    record = load_cached_inventory(inventory_file, tmp_path)
    with pytest.raises(AttributeError, match="read-only"):
        record.model("glm-4_6-5b").port = 9999  # type: ignore[misc]


def test_a_changed_file_is_validated_again_and_a_bad_change_is_refused(
    inventory_file: Path, tmp_path: Path
) -> None:
    load_cached_inventory(inventory_file, tmp_path)
    inventory_file.write_text(RICH.replace("port: 8081", "port: 8090"))
    assert load_cached_inventory(inventory_file, tmp_path).model("qwq-32b-8bit").port == 8090
    inventory_file.write_text(RICH.replace("port: 8081", "port: many"))
    with pytest.raises(InventoryError) as caught:
        load_cached_inventory(inventory_file, tmp_path)
    assert any("models.qwq-32b-8bit.port" in p for p in caught.value.problems)
    assert len(snapshots(tmp_path)) == 2  # the bad bytes are never snapshotted


def test_an_unreadable_or_undecodable_file_is_reported_as_the_full_load_reports_it(
    tmp_path: Path,
) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        load_cached_inventory(tmp_path / "missing.yaml", tmp_path)
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"nodes: {a: {ssh: caf\xe9}}\n")
    with pytest.raises(InventoryError, match="not UTF-8"):
        load_cached_inventory(bad, tmp_path)
    assert snapshots(tmp_path) == []


def forge(cache: Path, inventory_file: Path) -> Path:
    """The snapshot of `inventory_file` rewritten to say port 1 for glm: a forged scope."""
    load_cached_inventory(inventory_file, cache)
    (snapshot,) = snapshots(cache)
    snapshot.write_text(snapshot.read_text().replace('"port":8080', '"port":1'))
    return snapshot


@pytest.mark.parametrize("loosen", ["file", "dir"])
def test_a_snapshot_others_could_write_is_never_read(
    inventory_file: Path, tmp_path: Path, loosen: str
) -> None:
    cache = tmp_path / "cache"
    snapshot = forge(cache, inventory_file)
    assert read_snapshot(snapshot).model("glm-4_6-5b").port == 1  # type: ignore[union-attr]
    (snapshot if loosen == "file" else cache).chmod(0o666 if loosen == "file" else 0o777)
    assert read_snapshot(snapshot) is None
    assert load_cached_inventory(inventory_file, cache).model("glm-4_6-5b").port == 8080


def test_a_snapshot_through_a_symlink_or_corrupt_is_ignored(
    inventory_file: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    snapshot = forge(cache, inventory_file)
    elsewhere = tmp_path / "elsewhere.json"
    snapshot.rename(elsewhere)
    snapshot.symlink_to(elsewhere)
    assert read_snapshot(snapshot) is None
    snapshot.unlink()
    snapshot.write_text('{"__record__": "Inventory", "nodes": [')
    assert read_snapshot(snapshot) is None
    assert load_cached_inventory(inventory_file, cache).model("glm-4_6-5b").port == 8080


def test_the_cache_keeps_only_the_newest_snapshots(inventory_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for port in range(9000, 9000 + KEEP + 3):
        inventory_file.write_text(RICH.replace("port: 8081", f"port: {port}"))
        load_cached_inventory(inventory_file, cache)
    assert len(snapshots(cache)) == KEEP
    assert (cache / f"inventory-{snapshot_key(inventory_file.read_bytes())}.json").exists()


def test_an_unwritable_cache_costs_only_the_full_load(inventory_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "not-a-dir"
    cache.write_text("")
    assert load_cached_inventory(inventory_file, cache).model("glm-4_6-5b").port == 8080


def test_the_cache_lives_in_the_users_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/srv/cache")
    assert default_cache_dir() == Path("/srv/cache/mlx-medic")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/Users/ai")
    assert default_cache_dir() == Path("/Users/ai/.cache/mlx-medic")
    monkeypatch.setenv("HOME", "/")  # launchd's daemons: no home, no snapshot
    assert default_cache_dir() is None


def test_reading_a_snapshot_loads_neither_pydantic_nor_yaml(
    inventory_file: Path, tmp_path: Path
) -> None:
    load_cached_inventory(inventory_file, tmp_path)
    code = (
        "import sys\nfrom mlx_medic.inventory.snapshot import load_cached_inventory\n"
        f"inventory = load_cached_inventory({str(inventory_file)!r}, "
        f"__import__('pathlib').Path({str(tmp_path)!r}))\n"
        "print(inventory.model('glm-4_6-5b').head,"
        " *sorted(m for m in ('pydantic', 'yaml') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ai001"]


def loads_apart(inventory: Path, cache: Path | None) -> list[str]:
    """What a fresh interpreter prints after `load_inventory_apart`: glm's head and which
    of pydantic and PyYAML it imported."""
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from mlx_medic.inventory.snapshot import load_inventory_apart\n"
        f"inventory = load_inventory_apart(Path({str(inventory)!r}), "
        f"{f'Path({str(cache)!r})' if cache else None})\n"
        "print(inventory.model('glm-4_6-5b').head,"
        " *sorted(m for m in ('pydantic', 'yaml') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "HOME": "/"}  # no default cache dir
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("cached", [True, False], ids=["with a cache dir", "without one"])
def test_the_exporters_reader_validates_in_a_child_and_never_loads_the_schema_itself(
    inventory_file: Path, tmp_path: Path, cached: bool
) -> None:
    cache = tmp_path / "cache" if cached else None
    assert loads_apart(inventory_file, cache) == ["ai001"]  # the child validated it
    if cache:
        assert len(snapshots(cache)) == 1
    assert loads_apart(inventory_file, cache) == ["ai001"]  # from the snapshot, or a child
    same(load_inventory(inventory_file), load_inventory_apart(inventory_file, cache))


def test_the_exporters_reader_refuses_a_bad_inventory_as_the_full_load_does(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: {x: 1}\n")
    with pytest.raises(InventoryError) as apart:
        load_inventory_apart(bad, tmp_path / "cache")
    with pytest.raises(InventoryError) as in_full:
        load_inventory(bad)
    assert str(apart.value) == str(in_full.value)
    assert snapshots(tmp_path / "cache") == []
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory_apart(tmp_path / "missing.yaml", tmp_path / "cache")


def test_a_changed_schema_source_makes_every_snapshot_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlx_medic.inventory.snapshot as snapshot_module

    source = tmp_path / "inventory.py"
    source.write_text("# version 1\n")
    monkeypatch.setattr(snapshot_module, "_SCHEMA_SOURCES", (source,))
    before = snapshot_key(b"nodes: {}")
    source.write_text("# version 2, a new default\n")
    assert snapshot_key(b"nodes: {}") != before


def test_every_module_the_schema_is_built_from_is_a_source_of_the_key() -> None:
    """A source that is not there is skipped by the key, so a moved module would silently
    stop making its snapshots a miss: each must exist, and every module of the inventory
    that builds or loads pydantic models must be one."""
    import mlx_medic.inventory.snapshot as snapshot_module

    sources = snapshot_module._SCHEMA_SOURCES
    assert all(path.is_file() for path in sources), sources
    package = Path(snapshot_module.__file__).parent
    builders = {
        path
        for path in package.glob("*.py")
        if "\nfrom pydantic import" in path.read_text() and path.stem != "reference"
    }
    assert builders <= {path.resolve() for path in sources}, builders
