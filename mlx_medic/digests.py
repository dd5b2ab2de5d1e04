"""SHA-256 and BLAKE2b without OpenSSL's libcrypto.

`hashlib` loads `_hashlib`, which maps libcrypto (3.4 MiB of the exporter's resident
memory, bench/busy_node) although these two digests have CPython's own implementations,
the ones hashlib itself falls back to when OpenSSL lacks them. Same algorithms, same
digests; hashlib's when this interpreter has no builtin one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def _sha256() -> Callable[[bytes], Digest]:
    for module in ("_sha2", "_sha256"):  # 3.12 and later; 3.11
        try:
            return __import__(module).sha256  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    from hashlib import sha256

    return sha256


try:
    from _blake2 import blake2b
except ImportError:  # an interpreter built without it
    from hashlib import blake2b

sha256 = _sha256()

__all__ = ["blake2b", "sha256"]
