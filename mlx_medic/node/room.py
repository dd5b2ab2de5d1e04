"""What room a node has for a model before a start: its available memory (psutil; on
macOS no more than a nonzero `iogpu.wired_limit_mb`, the GPU's wired-memory cap), the
free bytes where mlx_lm.share stages the weights (beside them: share renames its
`tmp*` dir into place, so both are on one filesystem), and the weights it holds (a
manifest of file names and sizes, which the wrapper compares with the head's; with
`sha256`, as `serve.preseed.compare: sha256` asks, also each file's SHA-256, which reads
every byte of the weights).

Test seam (the testbed's, never a real cluster's): a file
`<state_dir>/testbed/available_memory_bytes` holding a whole number replaces psutil's
reading on that node, so a test can make one node short of memory; the document then
names the seam (`memory.seam`) and the wrapper logs a warning at every start.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_medic.inventory.methods import MEMORY_MARGIN
from mlx_medic.platform.commands import CommandError, ParseError, Runner, output_of

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model

TIMEOUT = 5.0
MEMORY_SEAM = Path("testbed") / "available_memory_bytes"  # under the state dir


def available_memory(
    state_dir: Path, runner: Runner, platform: str, psutil_available: int | None = None
) -> dict[str, Any]:
    """`available_bytes` (the seam's, else psutil's: `psutil_available` when the caller
    read it already) and, on macOS, `wired_limit_bytes` (null: no cap set) or its
    reading's error."""
    from mlx_medic.platform.macos_memory import WIRED_LIMIT_ARGV, parse_wired_limit_bytes

    if psutil_available is None:
        import psutil

        psutil_available = int(psutil.virtual_memory().available)
    memory: dict[str, Any] = {"available_bytes": psutil_available}
    seam = state_dir / MEMORY_SEAM
    if seam.is_file():
        text = seam.read_text(encoding="ascii", errors="replace").strip()
        if not text.isdigit():
            raise ValueError(f"{seam}: {text[:40]!r} is not a whole number of bytes")
        memory.update(available_bytes=int(text), seam=str(seam))
    memory["wired_limit_bytes"] = None
    if platform == "darwin":
        try:
            memory["wired_limit_bytes"] = parse_wired_limit_bytes(
                output_of(runner, WIRED_LIMIT_ARGV, TIMEOUT)
            )
        except (CommandError, ParseError) as exc:
            memory["wired_limit_error"] = str(exc)
    return memory


def weights_manifest(path: Path) -> dict[str, int] | None:
    """Each regular file below `path` (relative name -> bytes), symlinks not followed;
    None when `path` is no dir here."""
    if not path.is_dir() or path.is_symlink():
        return None
    manifest: dict[str, int] = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            file = Path(root) / name
            if file.is_file() and not file.is_symlink():
                manifest[str(file.relative_to(path))] = file.stat().st_size
    return manifest


def weights_digests(path: Path, manifest: dict[str, int]) -> dict[str, str]:
    """The SHA-256 (hex) of each file of `manifest` below `path`, read in full (OpenSSL's,
    imported here: the exporter imports this module and maps no libcrypto)."""
    import hashlib

    digests = {}
    for name in manifest:
        with (path / name).open("rb") as handle:
            digests[name] = hashlib.file_digest(handle, "sha256").hexdigest()
    return digests


def free_bytes(path: Path) -> tuple[Path, int]:
    """Free bytes (for an unprivileged user) on the filesystem of `path`, or of its nearest
    existing ancestor, which share's staging dir will be made in."""
    while not path.exists() and path != path.parent:
        path = path.parent
    stats = os.statvfs(path)
    return path, stats.f_bavail * stats.f_frsize


def room(
    state_dir: Path, weights: Path | None, runner: Runner, platform: str, sha256: bool = False
) -> dict[str, Any]:
    """The node's room document; `sha256`: the weights' digests too (`weights.sha256`)."""
    document: dict[str, Any] = {
        "memory": available_memory(state_dir, runner, platform),
        "weights": None,
        "staging": None,
    }
    if weights is not None:
        manifest = weights_manifest(weights)
        document["weights"] = {
            "path": str(weights),
            "files": manifest,
            "bytes": None if manifest is None else sum(manifest.values()),
        }
        if sha256:
            document["weights"]["sha256"] = (
                None if manifest is None else weights_digests(weights, manifest)
            )
        where, free = free_bytes(weights.parent)
        document["staging"] = {
            "dir": str(weights.parent),
            "exists": where == weights.parent,
            "free_bytes": free,
        }
    return document


def memory_needed(model: Model, weights_bytes: int | None) -> int | None:
    """What a rank needs free: `serve.memory_needed`, else its share of the weights plus
    MEMORY_MARGIN; None when neither is known."""
    if model.serve.memory_needed is not None:
        return int(model.serve.memory_needed)
    if not weights_bytes:
        return None
    return math.ceil(weights_bytes / len(model.nodes) * MEMORY_MARGIN)


def usable_memory(memory: dict[str, Any]) -> int:
    """What a rank may take: the available memory, at most the GPU's wired cap."""
    cap = memory.get("wired_limit_bytes")
    available = int(memory["available_bytes"])
    return available if cap is None else min(available, int(cap))
