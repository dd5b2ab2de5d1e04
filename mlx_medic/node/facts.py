"""What a playbook reads about a node before it acts and when it escalates: memory, RDMA
ports and objects, recent error signatures in a model's service logs, the serve wrapper's
record of the model, the MLX and mlx-lm versions, and the OS build. Each reading is the
exporter's (the platform parsers its `memory` and `rdma` collectors use, the signatures
its `logs` collector counts), so the playbook and the dashboards say the same thing.

Every reading stands alone: a tool that fails leaves its part null with the reason beside
it, never a fake zero, and no RDMA on a node (no `ibv_devinfo`) is `"rdma": null`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlx_medic.platform.commands import CommandError, ParseError, Runner, output_of
from mlx_medic.serve.record import read_serve_record
from mlx_medic.signatures import LogSignature, signatures_matching
from mlx_medic.state.files import StateFileError

TIMEOUT = 5.0
SW_VERS_ARGV = ("sw_vers", "-buildVersion")
OS_RELEASE = Path("/etc/os-release")
TAIL_BYTES = 1 << 20  # of each log file: recent errors are at its end
VERSIONED = ("mlx", "mlx-lm")


def memory_facts(runner: Runner, platform: str) -> dict[str, Any]:
    """Available bytes (psutil, as `mlx_memory_available_bytes`); on macOS the pressure
    level and vm_stat's wired and compressor bytes, as the memory collector reads them."""
    import psutil

    from mlx_medic.platform.macos_memory import (
        PRESSURE_ARGV,
        VM_STAT_ARGV,
        parse_pressure_level,
        parse_vm_stat,
    )

    facts: dict[str, Any] = {"available_bytes": int(psutil.virtual_memory().available)}
    if platform != "darwin":
        return facts
    try:
        facts["pressure_level"] = parse_pressure_level(output_of(runner, PRESSURE_ARGV, TIMEOUT))
    except (CommandError, ParseError) as exc:
        facts["pressure_level"], facts["pressure_level_error"] = None, str(exc)
    try:
        stats = parse_vm_stat(output_of(runner, VM_STAT_ARGV, TIMEOUT))
        facts["wired_bytes"], facts["compressor_bytes"] = stats.wired_bytes, stats.compressor_bytes
    except (CommandError, ParseError) as exc:
        facts["wired_bytes"] = facts["compressor_bytes"] = None
        facts["vm_stat_error"] = str(exc)
    return facts


def rdma_facts(runner: Runner) -> dict[str, Any] | None:
    """Port states (ibv_devinfo) and live PD/QP counts (ioclasscount); None without RDMA."""
    from mlx_medic.platform.macos_rdma import (
        IBV_DEVINFO_ARGV,
        IOCLASSCOUNT_ARGV,
        parse_ibv_devinfo,
        rdma_object_counts,
        rdma_tool_output,
    )

    try:
        ports_text = rdma_tool_output(runner, IBV_DEVINFO_ARGV, TIMEOUT)
    except (CommandError, ParseError) as exc:
        return {"ports": None, "objects": None, "error": str(exc)}
    if ports_text is None:
        return None
    facts: dict[str, Any] = {"objects": None}
    try:
        ports = parse_ibv_devinfo(ports_text)
        facts["ports"] = [
            {"device": p.device, "port": p.port, "state": p.state, "active": p.active}
            for p in ports
        ]
        counts_text = rdma_tool_output(runner, IOCLASSCOUNT_ARGV, TIMEOUT)
        if counts_text is not None:
            facts["objects"] = rdma_object_counts(counts_text)
    except (CommandError, ParseError) as exc:
        facts.setdefault("ports", None)
        facts["error"] = str(exc)
    return facts


def _tail_lines(path: Path, limit: int) -> tuple[list[tuple[int, str]], int]:
    """The last whole lines within `limit` bytes, each with the byte offset it starts at,
    and the file's size: the offsets tell which lines a start wrote (after its mark)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        begin = max(0, size - limit)
        handle.seek(begin)
        data = handle.read(limit)
    lines: list[tuple[int, str]] = []
    offset = begin
    for raw in data.splitlines(keepends=True):
        lines.append((offset, raw.decode("utf-8", "replace").rstrip("\r\n")))
        offset += len(raw)
    return (lines[1:] if begin > 0 else lines), size  # the first may be cut


def recent_errors(
    files: Sequence[Path],
    signatures: Sequence[LogSignature],
    count: int,
    tail_bytes: int = TAIL_BYTES,
) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, int]]:
    """The last `count` lines that match a signature (oldest first, each with the file,
    every signature it matches and the byte offset it starts at), the files that could
    not be read, with why, and the size of each file read."""
    found: list[dict[str, Any]] = []
    unreadable: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for path in files:
        try:
            lines, sizes[str(path)] = _tail_lines(path, tail_bytes)
        except OSError as exc:
            unreadable[str(path)] = exc.strerror or str(exc)
            continue
        for offset, line in lines:
            for name in signatures_matching(line, signatures):
                found.append({"file": str(path), "signature": name, "line": line, "offset": offset})
    return found[-count:] if count else [], unreadable, sizes


def installed_version(name: str, path: Sequence[str]) -> str | None:
    """`name`'s version as its `NAME-VERSION.dist-info` dir on `path` spells it (how pip
    and uv install a wheel), from the first entry that has one, as imports find it; None
    when no entry holds the package. Why not importlib.metadata: importing it (email,
    zipfile, csv) cost a facts helper a fifth of its start, and facts runs on every node
    at every recovery. An egg install (`.egg-info`, `.egg`) is left to importlib.metadata,
    which reads its PKG-INFO."""
    wanted = name.replace("-", "_").replace(".", "_").lower()
    for entry in path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for found in names:
            stem, _, suffix = found.rpartition(".")
            dist, _, version = stem.partition("-")
            if dist.replace(".", "_").lower() != wanted:
                continue
            if suffix == "dist-info" and version:
                return version
            if suffix in ("egg-info", "egg"):
                return _metadata_version(name)
    return None


def _metadata_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions(path: Sequence[str] | None = None) -> dict[str, Any]:
    """MLX and mlx-lm as this interpreter sees them (the one the helper runs with; on a node
    where the ranks run another Python, ask that one)."""
    found: dict[str, Any] = {
        "python": sys.executable,
        "python_version": ".".join(str(part) for part in sys.version_info[:3]),
    }
    for name in VERSIONED:
        found[name] = installed_version(name, sys.path if path is None else path)
    return found


def os_build(runner: Runner, platform: str, os_release: Path = OS_RELEASE) -> dict[str, Any]:
    """macOS: `sw_vers -buildVersion`; Linux: /etc/os-release's PRETTY_NAME and the kernel."""
    uname = os.uname()
    facts: dict[str, Any] = {"system": uname.sysname, "release": uname.release}
    if platform == "darwin":
        try:
            build = output_of(runner, SW_VERS_ARGV, TIMEOUT).strip()
            facts["build"] = build or None
        except CommandError as exc:
            facts["build"], facts["build_error"] = None, str(exc)
        facts["source"] = " ".join(SW_VERS_ARGV)
        return facts
    pretty = None
    try:
        for line in os_release.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key == "PRETTY_NAME":
                pretty = value.strip().strip('"')
    except OSError:
        pass
    facts["build"] = f"{pretty} (kernel {facts['release']})" if pretty else facts["release"]
    facts["source"] = f"{os_release} and uname" if pretty else "uname"
    return facts


def serve_facts(state_dir: Path, model: str) -> dict[str, Any] | None:
    """The serve wrapper's record of `model` (kept on its head), as the fallback reads it:
    its state, the backend it serves or tries, and the failure of its last failed start,
    the JACCL one first (that is what a ring pin answers). None where no wrapper recorded
    the model; the reason when the record cannot be read."""
    try:
        record = read_serve_record(state_dir, model)
    except StateFileError as exc:
        return {"error": str(exc)}
    if record is None:
        return None
    failures = sorted(record.failures, key=lambda f: f.backend != "jaccl")
    failure = failures[0] if failures else None
    return {
        "state": record.state,
        "backend": record.backend,
        "failed_starts": record.failed_starts,
        "failed_backends": [f.backend for f in record.failures],
        "backend_reason": record.backend_reason,
        "argv": list(record.argv),
        "reboot": list(record.reboot),
        "failure": None
        if failure is None
        else {
            "backend": failure.backend,
            "host": failure.host,
            "reason": failure.reason,
            "line": failure.line,
        },
    }


def boot_facts(state_dir: Path, node: str) -> dict[str, Any]:
    """This boot's id, and the survivors of SIGKILL its protection-domain ledger records
    that still live here with the domains each holds: what `mlx-medic drain` shows and
    `undrain` compares (a new id: the node rebooted, its ledger starts empty); and when
    this boot began (`booted_at`, Unix time as psutil reads it), which the remediator's
    guarded reboot reads (its `booted-recently` guard)."""
    import psutil

    from mlx_medic.node.boot_id import current_boot_id
    from mlx_medic.state.ledger import LedgerError, live_survivors, read_ledger

    boot_id = current_boot_id()
    booted_at = float(psutil.boot_time())
    try:
        ledger = read_ledger(state_dir, node, boot_id)
    except LedgerError as exc:
        return {
            "id": boot_id,
            "booted_at": booted_at,
            "survivors": None,
            "survivors_error": str(exc),
        }
    survivors = [
        {
            "pid": entry.pid,
            "model": entry.model,
            "backend": entry.backend,
            "devices": list(entry.devices),
            "domains": entry.survivor(node).domains,
        }
        for entry in live_survivors(ledger)
    ]
    return {"id": boot_id, "booted_at": booted_at, "survivors": survivors}


def drain_facts(state_dir: Path) -> dict[str, Any] | None:
    """This node's drain record (`mlx-medic drain`), None when not drained or unreadable."""
    from dataclasses import asdict

    from mlx_medic.state.files import StateFileError
    from mlx_medic.state.node_drain import read_node_drain

    try:
        record = read_node_drain(state_dir)
    except StateFileError as exc:
        return {"error": str(exc)}
    return None if record is None else {**asdict(record), "models": list(record.models)}
