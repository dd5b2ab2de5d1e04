"""The links a run keeps of the alert that started it, and which of them may be links.

On-call follows them from the page and reads them in `mlx-medic log`: the alert's
`runbook_url` annotation, its `generatorURL` (the alert in Prometheus) and the
payload's `externalURL` (Alertmanager itself). They come from whoever can post an
alert, so `refusal` alone decides what is shown as a link: an absolute http or https
URL, whole (not cut), of printable ASCII. Anything else (`javascript:`, `data:`, a
relative path) is shown as text, never in an href.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from mlx_medic.remediator.label_limits import URL_BYTES, cut, is_cut

# Each link's name in the journal and the API, and what the log and the page call it.
LINK_NAMES: dict[str, tuple[str, str]] = {
    "runbook_url": ("runbook", "Runbook"),
    "generator_url": ("alert", "Alert in Prometheus"),
    "external_url": ("alertmanager", "Alertmanager"),
}
SAFE_SCHEMES = frozenset({"http", "https"})


def bounded_links(links: Any) -> dict[str, str]:
    """The known links that are non-empty text, each cut to URL_BYTES, in LINK_NAMES
    order; anything else (an older journal's NULL, junk) reads as none."""
    if not isinstance(links, Mapping):
        return {}
    return {
        name: cut(value, URL_BYTES)
        for name in LINK_NAMES
        if isinstance(value := links.get(name), str) and value
    }


def refusal(url: str) -> str | None:
    """None when `url` may be shown as a link; else why not, in a few words."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "does not parse as a URL"
    if parts.scheme not in SAFE_SCHEMES:
        return f"scheme {parts.scheme[:20]}" if parts.scheme else "not an absolute URL"
    if is_cut(url):
        return f"cut to {URL_BYTES} bytes"
    if not all("!" <= ch <= "~" for ch in url):
        return "has spaces or characters outside printable ASCII"
    if not parts.hostname:
        return "no host"
    return None


def split_links(links: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the links that may be links, the ones shown only as text)."""
    safe = {name: url for name, url in links.items() if refusal(url) is None}
    return safe, {name: url for name, url in links.items() if name not in safe}


def printable(text: str) -> str:
    """`text` with control characters shown as `\\xNN`, for a terminal."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)
