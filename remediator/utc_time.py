"""The one time format on-call reads everywhere (`mlx-medic log`, its `--json`,
`/api/remediations`, the page): ISO 8601 in UTC to the second, e.g.
2026-12-03T21:05:29Z. The journal keeps Unix times; this is how they are shown."""

from __future__ import annotations

from datetime import UTC, datetime

ISO_UTC = "%Y-%m-%dT%H:%M:%SZ"


def iso_utc(stamp: float) -> str:
    """A Unix time as ISO 8601 UTC, e.g. 2026-12-03T21:05:29Z."""
    return datetime.fromtimestamp(stamp, UTC).strftime(ISO_UTC)


def iso_utc_or_none(stamp: float | None) -> str | None:
    """`iso_utc`, or None for a time not reached yet (a run not ended)."""
    return None if stamp is None else iso_utc(stamp)
