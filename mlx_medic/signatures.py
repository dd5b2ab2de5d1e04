"""Error signatures: the log lines that announce an MLX/JACCL failure.

One list shared by the exporter (which counts them per log file) and the
remediator (which reads the first error of a burst as the cause). Names are
Prometheus label values, so they are snake_case and never renamed. Patterns
follow the exact texts in MLX (https://github.com/ml-explore/mlx: `mlx/distributed/`,
`mlx/backend/metal/`, `python/mlx/_distributed_utils/launch.py`), mlx-lm and the incident
write-ups (seed 000:
https://valensas.com/blog/how-we-fixed-a-silent-killer-in-our-mac-studio-llm-cluster);
the tests hold the verbatim lines and near-misses.

Every signature also carries `anchors`: literal byte strings of which at least
one occurs in every line the pattern matches. Log readers search chunks of
bytes for the anchors first and run the regular expressions only on the few
lines that contain one, which is what makes reading a gigabyte affordable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import TYPE_CHECKING

from mlx_medic.inventory.names import NAME_PATTERN

if TYPE_CHECKING:  # types only: discovery mode never loads the inventory's schema
    from mlx_medic.inventory.schema import Inventory

# Anchors shorter than this select too many lines to be worth a search pass.
MIN_ANCHOR_LENGTH = 4


@dataclass(frozen=True)
class LogSignature:
    """A named regular expression that marks one kind of failure in a log line."""

    name: str
    pattern: str
    description: str = ""
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    anchors: tuple[bytes, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(NAME_PATTERN, self.name):
            raise ValueError(f"signature name {self.name!r} is not a label-safe name")
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"signature {self.name!r}: not a regular expression: {exc}") from exc
        object.__setattr__(self, "regex", compiled)
        literals = required_literals(self.pattern)
        anchors = tuple(lit.encode("utf-8") for lit in literals) if literals else ()
        object.__setattr__(self, "anchors", anchors)

    def matches(self, line: str) -> bool:
        return self.regex.search(line) is not None


# --- prefilter literals ----------------------------------------------------------


def required_literals(pattern: str) -> list[str] | None:
    """Literal strings such that every match of `pattern` contains one of them.

    None when no such set is evident (case-insensitive patterns, alternations
    with a branch that has no literal, patterns made of classes only). Then a
    reader must run the regex over every line.
    """
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return None
    if parsed.state.flags & re.IGNORECASE:
        return None
    found = _literals_of(list(parsed))
    if not found or any(len(lit) < MIN_ANCHOR_LENGTH for lit in found):
        return None
    return sorted(set(found))


def _literals_of(items: list[tuple[object, object]]) -> list[str] | None:
    if len(items) == 1:
        op, arg = items[0]
        if op is sre_constants.BRANCH:
            out: list[str] = []
            for branch in arg[1]:  # type: ignore[index]
                literals = _literals_of(list(branch))
                if not literals:
                    return None
                out += literals
            return out
        if op is sre_constants.SUBPATTERN:
            flags: int = arg[1]  # type: ignore[index]
            if flags & re.IGNORECASE:
                return None
            return _literals_of(list(arg[3]))  # type: ignore[index]
    best, run = "", []
    for op, arg in items:
        if op is sre_constants.LITERAL:
            run.append(chr(arg))  # type: ignore[arg-type]
            continue
        best = max(best, "".join(run), key=len)
        run = []
    best = max(best, "".join(run), key=len)
    return [best] if best else None


def merged_anchors(anchors: Iterable[bytes], min_length: int = 7) -> list[bytes]:
    """Fewer, shorter anchors that still cover every original one.

    Two anchors sharing a long common substring (at least half the shorter one)
    are replaced by it, since a line with either contains it; an anchor
    containing another is dropped. Useful
    when each anchor costs a pass over the data (`bytes.find`); a multi-pattern
    engine does better with the full, more selective set.
    """
    pool = sorted(set(anchors), key=len)
    while True:
        best: tuple[int, int, bytes] | None = None
        for i, a in enumerate(pool):
            for j in range(i + 1, len(pool)):
                b = pool[j]
                match = SequenceMatcher(None, a, b, autojunk=False).find_longest_match(
                    0, len(a), 0, len(b)
                )
                enough = max(min_length, min(len(a), len(b)) // 2)
                if match.size >= enough and (best is None or match.size > len(best[2])):
                    best = (i, j, a[match.a : match.a + match.size])
        if best is None:
            break
        i, j, common = best
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [common]
    pool = sorted(set(pool), key=len)
    kept: list[bytes] = []
    for anchor in pool:
        if not any(shorter in anchor for shorter in kept):
            kept.append(anchor)
    return kept


# --- the built-in set ---------------------------------------------------------

# Lookbehind: `00000002` must be the whole hex code, not the tail of a longer number.
_NOT_HEX_BEFORE = r"(?<![0-9A-Fa-f])"

BUILTIN: tuple[LogSignature, ...] = (
    LogSignature(
        "jaccl_protection_domain",
        # Seed 002 quotes the same RuntimeError without the `[jaccl] ` prefix.
        r"(?:\[jaccl\] )?Couldn't allocate protection domain",
        "ibv_alloc_pd failed: protection domains exhausted or the Thunderbolt port is down",
    ),
    LogSignature(
        "jaccl_qp_rtr_errno_16",
        r"\[jaccl\] Changing queue pair to RTR failed with errno 16\b",
        "EBUSY: queue pairs held by an orphaned rank or stale RDMA state",
    ),
    LogSignature(
        "jaccl_qp_rtr_errno_22",
        r"\[jaccl\] Changing queue pair to RTR failed with errno 22\b",
        "EINVAL: GID or Thunderbolt Bridge problem",
    ),
    LogSignature(
        "jaccl_qp_rtr_errno_96",
        r"\[jaccl\] Changing queue pair to RTR failed with errno 96\b",
        "protection domains exhausted",
    ),
    LogSignature(
        "jaccl_qp_create",
        r"\[jaccl\] Creating the queue pair failed",
        "the device's queue pairs are all taken",
    ),
    LogSignature(
        "jaccl_connect_error_60",
        r"\[jaccl\] Couldn't connect \(error: ?60\)",
        "ETIMEDOUT: the peer did not answer on the side channel",
    ),
    LogSignature(
        "jaccl_connect_error_65",
        r"\[jaccl\] Couldn't connect \(error: ?65\)",
        "EHOSTUNREACH: on macOS often the Local Network Privacy block",
    ),
    LogSignature(
        "metal_gpu_timeout",
        _NOT_HEX_BEFORE + r"00000002:kIOGPUCommandBufferCallbackError\w*",
        "a Metal command buffer ran past the GPU timeout; the rank aborts",
    ),
    LogSignature(
        "metal_out_of_memory",
        _NOT_HEX_BEFORE + r"00000008:kIOGPUCommandBufferCallbackError\w*",
        "a Metal command buffer failed with Insufficient Memory",
    ),
    LogSignature(
        "metal_malloc_resource_limit",
        r"\[metal::malloc\] Resource limit \(\d+\) exceeded",
        "too many Metal buffers; kills the _generate thread",
    ),
    LogSignature(
        "launch_teardown_failed",
        r"CalledProcessError: Command .*pid=\$\(cat |\btmp\.None\b",
        "mlx.launch's remote kill script failed (the tmp.None pid file): ranks left running",
    ),
    LogSignature(
        "launch_hostfile_malformed",
        # argparse's `mlx.launch: error: ...`; mlx.launch starts no rank (exit status 2).
        r"\bThe hostfile is malformed: ",
        "mlx.launch refused the JACCL hostfile (RDMA devices missing or misplaced)",
    ),
    LogSignature(
        "launch_rank_failed",
        r"Node with rank \d+ (?:exited with code -?\d+|was killed)",
        "mlx.launch saw a rank fail (the launcher itself still exits 0)",
    ),
    LogSignature(
        "ring_peer_lost",
        r"\[ring\] (?:connection to a peer was lost|Too many send/recv errors\. Aborting)",
        "the ring backend lost a peer",
    ),
    LogSignature(
        "generate_thread_died",
        r"Exception in thread .*_generate",
        "mlx_lm.server's generation thread raised; /health may still answer",
    ),
)

BUILTIN_BY_NAME: dict[str, LogSignature] = {s.name: s for s in BUILTIN}


def signature_set(extra: Iterable[object] = ()) -> tuple[LogSignature, ...]:
    """The built-in signatures plus extra ones (objects with `name` and `pattern`).

    An extra signature with a built-in's name replaces it, so a site can tune a
    pattern without renaming the series its alerts use.
    """
    merged: dict[str, LogSignature] = dict(BUILTIN_BY_NAME)
    for item in extra:
        name, pattern = item.name, item.pattern  # type: ignore[attr-defined]
        merged[name] = LogSignature(name, pattern, "from the inventory")
    return tuple(merged.values())


def signatures_for(inventory: Inventory | None) -> tuple[LogSignature, ...]:
    return signature_set(inventory.signatures if inventory is not None else ())


def signatures_matching(line: str, signatures: Sequence[LogSignature] = BUILTIN) -> list[str]:
    """Names of every signature the line matches (a line can carry two)."""
    return [s.name for s in signatures if s.regex.search(line)]
