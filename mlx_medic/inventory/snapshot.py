"""The validated inventory kept as plain data, so a node helper starts without pydantic.

The remediator runs a node helper on every node at every step, and the serve wrapper runs
them at every start: importing pydantic and building the inventory's schema costs a
helper more than its own work. So the first load of an inventory's exact bytes validates
them in full (`parse_inventory`, every rule and message as always) and writes the result
to a snapshot in this user's cache dir; a later load of the same bytes by the same
mlx-medic reads the snapshot back as read-only records with the same fields and the same
methods (`mlx_medic.inventory.methods`). Only validated bytes are ever snapshotted, and a
changed file is a different key, so a helper never acts on an inventory the validator
has not passed. A snapshot is trusted only in a dir and a file owned by this user that
nobody else may write; anything wrong with the cache costs the full load, never a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, cast

import mlx_medic
from mlx_medic import __version__, digests
from mlx_medic.inventory.methods import (
    BackendsMethods,
    InventoryMethods,
    ModelMethods,
    ProcessPatternsMethods,
    ServiceMethods,
)

if TYPE_CHECKING:
    from mlx_medic.inventory.schema import Inventory

FORMAT = 1  # the snapshot's own layout; a change makes every older snapshot a miss
KEEP = 16  # snapshots kept per cache dir (one per inventory version in use)
CHILD_TIMEOUT = 120.0  # seconds for a child to validate an inventory (pydantic: about 1 s)
_RECORD = "__record__"
_PATH = "__path__"
# The schema's sources: a changed one (a new field, default or rule) is a new key.
_SCHEMA_SOURCES = tuple(
    Path(mlx_medic.__file__).parent.parent / name
    for name in (
        "mlx_medic/inventory/schema.py",
        "mlx_medic/inventory/fields.py",
        "mlx_medic/inventory/model.py",
        "mlx_medic/inventory/model_settings.py",
        "mlx_medic/inventory/load.py",
        "mlx_medic/inventory/names.py",
    )
)


class Record:
    """One validated inventory object's fields, as read-only attributes."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only (a validated inventory)")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:  # as a frozen pydantic model: only if every field hashes
        return hash((type(self).__name__, *vars(self).values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class ServiceRecord(ServiceMethods, Record):
    pass


class BackendsRecord(BackendsMethods[Record], Record):
    pass


class ProcessPatternsRecord(ProcessPatternsMethods, Record):
    pass


class ModelRecord(ModelMethods, Record):
    pass


class InventoryRecord(InventoryMethods[Any, Any], Record):
    pass


# pydantic class name -> the record that stands for it (plain Record when it has no methods)
RECORDS: dict[str, type[Record]] = {
    "Service": ServiceRecord,
    "Backends": BackendsRecord,
    "ProcessPatterns": ProcessPatternsRecord,
    "Model": ModelRecord,
    "Inventory": InventoryRecord,
}
_RECORD_NAMES = {record: name for name, record in RECORDS.items()}


def load_cached_inventory(path: str | Path, cache_dir: Path | None = None) -> Inventory:
    """The inventory at `path`: from its snapshot when one matches its bytes, else
    validated in full (InventoryError as `load_inventory`) and snapshotted."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError:
        return _load_in_full(path)  # it says why the file cannot be read
    directory = cache_dir or default_cache_dir()
    key = snapshot_key(data)
    snapshot = directory / f"inventory-{key}.json" if directory else None
    if snapshot is not None:
        cached = read_snapshot(snapshot)
        if cached is not None:
            return cached
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _load_in_full(path)  # it reports the encoding problem
    from mlx_medic.inventory.load import parse_inventory

    inventory = parse_inventory(text, str(path))
    if snapshot is not None:
        write_snapshot(snapshot, inventory)
    return inventory


def load_inventory_apart(path: str | Path, cache_dir: Path | None = None) -> Inventory:
    """The inventory at `path` without loading pydantic or PyYAML into this process: its
    snapshot when one matches its bytes, else validated by a child process (`python -m
    mlx_medic.inventory.snapshot PATH`, which snapshots it and prints the records). For
    a long-running reader (the exporter), to which the schema would add 12 MiB for good.
    An inventory the child refuses is loaded here in full, so its InventoryError is the
    same as `load_inventory`'s."""
    path = Path(path)
    directory = cache_dir or default_cache_dir()
    try:
        key = snapshot_key(path.read_bytes())
    except OSError:
        return _load_in_full(path)  # it says why the file cannot be read
    if directory is not None:
        cached = read_snapshot(directory / f"inventory-{key}.json")
        if cached is not None:
            return cached
    # -P: the working directory is not put on the child's sys.path (a root exporter must
    # not import a module planted where it was started).
    argv = [sys.executable, "-P", "-m", "mlx_medic.inventory.snapshot", str(path)]
    if directory is not None:
        argv += ["--cache-dir", str(directory)]
    import subprocess  # here: only a helper that validates the file starts a child

    child = subprocess.run(argv, capture_output=True, timeout=CHILD_TIMEOUT, check=False)
    if child.returncode == 0:
        with contextlib.suppress(ValueError, TypeError):
            document = json.loads(child.stdout, object_hook=_decode)
            if isinstance(document, InventoryRecord):
                return cast("Inventory", document)
    return _load_in_full(path)


def _load_in_full(path: Path) -> Inventory:
    from mlx_medic.inventory.load import load_inventory

    return load_inventory(path)


def default_cache_dir() -> Path | None:
    """`$XDG_CACHE_HOME/mlx-medic`, else `~/.cache/mlx-medic`; None without a home."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        home = os.environ.get("HOME")
        if not home or home == "/":
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "mlx-medic"


def snapshot_key(data: bytes) -> str:
    """What a snapshot must match: the file's bytes, this mlx-medic and its schema source."""
    digest = digests.sha256(data)
    for path in _SCHEMA_SOURCES:
        try:
            source = path.stat()
        except OSError:
            continue
        digest.update(f"|{source.st_size}|{source.st_mtime_ns}".encode())
    digest.update(f"|{__version__}|{FORMAT}".encode())
    return digest.hexdigest()


def _trusted(status: os.stat_result) -> bool:
    """Ours, and nobody else may write it."""
    return status.st_uid == os.getuid() and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read_snapshot(snapshot: Path) -> Inventory | None:
    """The records in `snapshot`, or None when it is missing, unreadable or not trusted."""
    try:
        if not _trusted(os.stat(snapshot.parent)):
            return None
        descriptor = os.open(snapshot, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(descriptor, "rb") as handle:
            if not _trusted(os.fstat(handle.fileno())):
                return None
            document = json.loads(handle.read(), object_hook=_decode)
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(document, InventoryRecord):
        return None
    return cast("Inventory", document)


def _decode(value: dict[str, Any]) -> Any:
    if _PATH in value:
        return Path(value[_PATH])
    name = value.pop(_RECORD, None)
    if name is None:
        return value  # a plain mapping (serve_args)
    return RECORDS.get(name, Record)(value)


def write_snapshot(snapshot: Path, inventory: Inventory) -> None:
    """Write `inventory` to `snapshot` atomically (0600, in a 0700 dir); keep the newest
    KEEP snapshots. Failing to write is not an error: the next load validates again."""
    try:
        snapshot.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _trusted(os.stat(snapshot.parent)):
            return
        text = json.dumps(encode(inventory), separators=(",", ":"))
        import tempfile  # here: only the validating child writes a snapshot

        handle, temporary = tempfile.mkstemp(dir=snapshot.parent, prefix=".inventory-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(temporary, snapshot)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _prune(snapshot.parent)
    except OSError:
        return


def _prune(directory: Path) -> None:
    snapshots = []
    for entry in directory.glob("inventory-*.json"):
        try:
            snapshots.append((entry.stat().st_mtime_ns, entry))
        except OSError:
            continue
    for _, entry in sorted(snapshots, reverse=True)[KEEP:]:
        entry.unlink(missing_ok=True)


def encode(value: Any) -> Any:
    """A validated inventory object as JSON, each model tagged with its class name."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        fields = {name: encode(getattr(value, name)) for name in type(value).model_fields}
        return {_RECORD: type(value).__name__, **fields}
    if isinstance(value, Record):  # read back from a snapshot
        return {_RECORD: _RECORD_NAMES.get(type(value), "Record"), **encode(vars(value))}
    if isinstance(value, PurePath):
        return {_PATH: str(value)}
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    return value


def main(argv: list[str] | None = None) -> int:
    """Validate an inventory, snapshot it, and print its records (for load_inventory_apart)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("inventory", type=Path)
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    from mlx_medic.inventory.methods import InventoryError

    try:
        inventory = load_cached_inventory(args.inventory, args.cache_dir)
    except InventoryError as exc:
        print(exc, file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(encode(inventory), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
