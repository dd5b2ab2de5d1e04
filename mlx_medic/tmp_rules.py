"""What an interrupted run leaves on disk: stale tmp entries and mlx.launch leftovers.

One rule for everyone who counts or removes them: the exporter counts with it
(`mlx_stale_tmp_*`, `mlx_launch_leftover_files`) and the clean step removes exactly
what it lists, so what the dashboards show is what the arm deletes.

The dirs (`scope_dirs`): every `tmp_dirs` and `cache_dirs` entry of the models on a
node, alike (the seed's clean-up emptied its CACHE_DIR's `tmp*` too). A dir several
of them name (the example gives two models one Hugging Face cache) is one shared
dir: its entries are weighed once, and its stale age is the longest of the sharing
models' `policy.stale_tmp_age`, so an entry is stale only when it is older than
every sharing model's age (and, as for any dir, no process uses it).

Stale tmp entries (`stale_entries`). In such a dir (the dir itself may be a
symlink, as macOS's /tmp is), an entry at depth one is stale when all of these hold:
- its name starts with `tmp` (`TemporaryDirectory`, `mkstemp`, mlx_lm.share's partial
  transfers: the seed's 817 GB and 868 GB);
- it is a directory or a regular file in itself: a symlink is never an entry and
  no symlink below an entry is followed;
- it is on the dir's filesystem, and no other filesystem below it is entered;
- no live process works in it or holds a file in it open (`PathsInUse`: cwd, fds);
- nothing anywhere in its tree changed for the dir's stale age (newest mtime).
Its size is the allocated bytes du counts (`mlx_medic.platform.weighers`). As with
`du -s tmpA tmpB`, a file with two names in the dir counts once: its second name is
no entry of its own while the first is listed (removing the first frees no block;
the second is an entry at the next look).

Launcher leftovers (`launcher_leftovers`). In the launch user's temp dirs, a regular
file (not a symlink, at most 64 KiB) named as `mktemp` names (`tmp.XXXXXXXXXX`) whose
content is mlx.launch's (`classify_launch_file`):
- a pid file whose process is gone: a dead launch's, whatever its age, or
- a hostfile / RDMA-devices JSON that no live process points at (`MLX_HOSTFILE`,
  `MLX_IBV_DEVICES` in its environment) and that is older than LEFTOVER_YOUNG seconds:
  nothing names its owner, and mlx.launch's rank script writes it a moment before the
  rank that points at it starts, so a young one may be a launch under way.
Any other file there is another program's and is never listed.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from mlx_medic.platform.open_paths import PathsInUse, environment_values
from mlx_medic.platform.process_files import read_small_file
from mlx_medic.platform.weighers import Weigher, default_weigher

if TYPE_CHECKING:  # types only: discovery mode never loads the inventory's schema
    from mlx_medic.inventory.model import Model

STALE_PREFIX = "tmp"
LEFTOVER_NAME = re.compile(r"tmp\.[A-Za-z0-9]{6,32}")
LEFTOVER_MAX_BYTES = 64 * 1024
LAUNCH_FILE_VARIABLES = ("MLX_HOSTFILE", "MLX_IBV_DEVICES")
LEFTOVER_YOUNG = 120.0  # seconds: an unowned hostfile younger than this may be a launch's


# --- the dirs --------------------------------------------------------------------------


@dataclass(frozen=True)
class ScopeDir:
    """One tmp or cache dir on a node, with every model there that names it."""

    path: Path
    stale_age: float  # seconds: the longest stale_tmp_age of `models`
    models: tuple[str, ...]

    @property
    def shared(self) -> bool:
        return len(self.models) > 1


def scope_dirs(models: Iterable[Model]) -> list[ScopeDir]:
    """The tmp and cache dirs of `models` (the ones on one node), each dir once, in
    inventory order; a shared dir takes the longest stale age of the models naming it."""
    found: dict[Path, ScopeDir] = {}
    for model in models:
        for path in model.scope_dirs():
            seen = found.get(path)
            if seen is None:
                found[path] = ScopeDir(path, model.policy.stale_tmp_age, (model.name,))
            elif model.name not in seen.models:
                found[path] = ScopeDir(
                    path,
                    max(seen.stale_age, model.policy.stale_tmp_age),
                    (*seen.models, model.name),
                )
    return list(found.values())


# --- stale tmp entries -----------------------------------------------------------------


@dataclass(frozen=True)
class StaleEntry:
    """One stale entry, as judged; `device` and `inode` let a remover check that the
    entry is still the one judged before it deletes anything."""

    path: Path
    is_dir: bool
    bytes: int  # allocated, as du counts
    newest_mtime: float  # the newest change anywhere in its tree
    device: int
    inode: int


@dataclass(frozen=True)
class StaleScan:
    """The stale entries of one dir; `error` set means the dir could not be read at all."""

    directory: Path
    entries: tuple[StaleEntry, ...] = ()
    skipped: int = 0  # parts we could not judge (vanished, unreadable, too deep)
    error: str | None = None


def stale_entries(
    directory: str | os.PathLike[str],
    now: float,
    stale_age: float,
    paths_in_use: PathsInUse,
    weigher: Weigher | None = None,
) -> StaleScan:
    """The stale `tmp*` entries at depth one of `directory` (see the module's rule)."""
    directory = Path(directory)
    label = str(directory)
    try:
        fd = os.open(label, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return StaleScan(directory, error="missing")
    except NotADirectoryError:
        return StaleScan(directory, error="not a directory")
    except OSError as exc:
        return StaleScan(directory, error=f"cannot open: {exc.strerror or exc}")
    try:
        dev = os.fstat(fd).st_dev
        busy = paths_in_use.under(label) | paths_in_use.under(os.path.realpath(label))
        candidates: dict[str, os.stat_result] = {}
        skipped = 0
        for name in os.listdir(fd):
            if not name.startswith(STALE_PREFIX):
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                skipped += 1
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                continue  # symlinks, sockets, fifos: not a leftover transfer
            if st.st_dev != dev or name in busy:
                continue
            candidates[name] = st
        weighing = (weigher or default_weigher()).weigh(fd, dev, list(candidates))
        entries = []
        for name, st in candidates.items():
            usage = weighing.usages.get(name)
            if usage is None or now - usage.newest_mtime < stale_age:
                continue
            entries.append(
                StaleEntry(
                    directory / name,
                    stat.S_ISDIR(st.st_mode),
                    usage.blocks * 512,
                    usage.newest_mtime,
                    st.st_dev,
                    st.st_ino,
                )
            )
        return StaleScan(directory, tuple(entries), skipped + weighing.skipped)
    except OSError as exc:
        return StaleScan(directory, error=f"cannot list: {exc.strerror or exc}")
    finally:
        os.close(fd)


# --- mlx.launch leftovers --------------------------------------------------------------


def _looks_like_launch_json(value: object) -> bool:
    """MLX_HOSTFILE (`[["ip:port", ...], ...]`) or MLX_IBV_DEVICES (`[[null, "rdma_en5"], ...]`)."""
    if not isinstance(value, list) or not value:
        return False
    strings: list[str] = []
    for row in value:
        if not isinstance(row, list):
            return False
        for cell in row:
            if cell is None:
                continue
            cells = cell if isinstance(cell, list) else [cell]
            if not all(isinstance(c, str) for c in cells):
                return False
            strings += cells
    pattern = re.compile(r"\S+:\d{1,5}|rdma_[A-Za-z0-9_]+")
    return bool(strings) and all(pattern.fullmatch(s) for s in strings)


def classify_launch_file(content: bytes) -> str | None:
    """'pidfile', 'hostfile', or None for a file mlx.launch did not write."""
    text = content.decode("utf-8", "replace").strip()
    if re.fullmatch(r"\d{1,10}", text):
        return "pidfile"
    if text.startswith("["):
        try:
            if _looks_like_launch_json(json.loads(text)):
                return "hostfile"
        except ValueError:
            return None
    return None


def _pid_alive(pid: int) -> bool:
    return pid > 0 and psutil.pid_exists(pid)


def _launch_file_references() -> set[str]:
    return environment_values(LAUNCH_FILE_VARIABLES)


def _age(dir_fd: int, name: str, now: float) -> float:
    """Seconds since the entry last changed; 0 when it cannot be told (kept, as young)."""
    try:
        return now - os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


@dataclass(frozen=True)
class LeftoverScan:
    files: tuple[Path, ...]  # the leftovers, in the order found
    read: tuple[Path, ...]  # the dirs that could be listed
    unreadable: tuple[tuple[Path, str], ...]  # the dirs that could not, and why


def launcher_leftovers(
    directories: Iterable[Path],
    *,
    pid_alive: Callable[[int], bool] = _pid_alive,
    referenced_paths: Callable[[], set[str]] = _launch_file_references,
    now: Callable[[], float] = time.time,
) -> LeftoverScan:
    """mlx.launch's files in `directories` that no live process needs (the module's rule)."""
    files: list[Path] = []
    hostfiles: list[Path] = []
    read: list[Path] = []
    unreadable: list[tuple[Path, str]] = []
    for directory in directories:
        try:
            fd = os.open(str(directory), os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            unreadable.append((directory, str(exc.strerror or exc)))
            continue
        try:
            names = os.listdir(fd)
            for name in names:
                if not LEFTOVER_NAME.fullmatch(name):
                    continue
                content = read_small_file(name, LEFTOVER_MAX_BYTES, dir_fd=fd)
                kind = classify_launch_file(content) if content is not None else None
                if kind == "pidfile" and not pid_alive(int(content or b"0")):
                    files.append(directory / name)
                elif kind == "hostfile" and _age(fd, name, now()) >= LEFTOVER_YOUNG:
                    hostfiles.append(directory / name)
            read.append(directory)
        except OSError as exc:
            unreadable.append((directory, f"cannot list: {exc.strerror or exc}"))
        finally:
            os.close(fd)
    if hostfiles:
        in_use = referenced_paths()
        in_use |= {os.path.realpath(p) for p in in_use}
        files += [
            p for p in hostfiles if str(p) not in in_use and os.path.realpath(p) not in in_use
        ]
    return LeftoverScan(tuple(files), tuple(read), tuple(unreadable))
