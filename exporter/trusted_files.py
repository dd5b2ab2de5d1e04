"""The root exporter runs only from files no other user can change.

Why: the exporter runs as root (it reads every process's files and sockets). If a user
could write its interpreter, a directory on the way to it, its virtualenv, the package it
imports or its inventory, that user could run code as root: replace `python`, drop a
module on the import path, or point the inventory at what root then reads. So before it
reads anything, a root exporter checks each such path and refuses to start (naming the
path, its owner and its mode) when one is writable by anyone but root.

Trusted: owned by root (uid 0), not writable by group or others; a directory writable by
others is trusted only with the sticky bit (`/tmp`: no one may then rename or remove
root's entry in it). Every component from `/` down is checked, and every symlink on the
way is followed and its target checked the same way (a link in a user's directory can be
re-pointed). The virtualenv and the package are checked whole: a writable file anywhere
in them is code root may import later.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mlx_medic.processes.not_ours import user_name

MAX_LINKS = 40  # as the kernel's ELOOP limit
CWD_ADVICE = (
    "it is the working directory: start the exporter as `python -I -m ...` or"
    " its console script, or from a directory only root may write"
)


@dataclass(frozen=True)
class Checked:
    """One path root relies on: what it is (for the error), and whether all below it is
    checked too."""

    what: str  # "interpreter", "virtualenv", "package", "import path", "inventory"
    path: Path
    tree: bool = False
    regular_file: bool = False  # must be a regular file (a config: never a FIFO or device)
    contents: bool = False  # a dir whose entries count (an import path): never sticky-writable
    advice: str = "make it root's and not group- or world-writable (chown root; chmod go-w)"

    @property
    def strict(self) -> bool:
        return self.tree or self.contents


@dataclass(frozen=True)
class Untrusted:
    """A path some user other than root could change."""

    what: str
    checked: Path
    path: str  # the component at fault (the checked path itself, or one on its way)
    uid: int
    mode: int
    why: str
    advice: str = Checked.advice

    def describe(self) -> str:
        at = "" if self.path == str(self.checked) else f": {self.path}"
        return (
            f"the {self.what} {self.checked}{at} {self.why} (owner {user_name(self.uid)},"
            f" mode {stat.filemode(self.mode)} {self.mode & 0o7777:04o}): a user who can"
            f" change it could gain root through it; {self.advice}"
        )


def fault(st: os.stat_result, *, sticky_ok: bool = True) -> str | None:
    """Why this file or directory is not root's alone; None when it is. A sticky dir
    others may write is fine on the way to root's entry (`sticky_ok`), never as a dir
    whose entries count: anyone may add a module to it."""
    if st.st_uid != 0:
        return f"is owned by {user_name(st.st_uid)} (uid {st.st_uid}), not root"
    if stat.S_ISLNK(st.st_mode):
        return None  # a link's own mode bits mean nothing; its dir and target count
    sticky_dir = sticky_ok and stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)
    if st.st_mode & stat.S_IWOTH and not sticky_dir:
        return "is world-writable"
    if st.st_mode & stat.S_IWGRP and not sticky_dir:
        return f"is group-writable (gid {st.st_gid})"
    return None


def chain(path: str | os.PathLike[str]) -> Iterator[tuple[str, os.stat_result]]:
    """Every component of `path` from `/` down, as lstat sees it, with every symlink on
    the way resolved and its target's components visited too; stops where the path does
    not exist (whoever may create the rest is judged by the last dir that does)."""
    yield from _resolve(os.path.abspath(path), [0])


def _resolve(path: str, links: list[int]) -> Iterator[tuple[str, os.stat_result]]:
    current = "/"
    try:
        yield current, os.lstat(current)
    except OSError:
        return
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)  # `current` is always free of links
            continue
        candidate = os.path.join(current, part)
        try:
            st = os.lstat(candidate)
        except OSError:
            return
        yield candidate, st
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        links[0] += 1
        if links[0] > MAX_LINKS:
            return
        try:
            target = os.readlink(candidate)
        except OSError:
            return
        resolved = os.path.join(current, target)  # an absolute target replaces `current`
        last = None
        for found in _resolve(resolved, links):
            last = found
            yield found
        if last is None:
            return
        current = os.path.realpath(resolved)


def tree(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Everything below `root`, each as lstat sees it; a link to a directory is walked
    at its target, once (`mlx_medic/exporter` is a link in a source checkout), and the
    link's own way there is checked by `chain` (see `untrusted`)."""
    stack, walked = [str(root)], set()
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield entry.path, st
            where = entry.path
            if stat.S_ISLNK(st.st_mode):
                try:
                    st, where = os.stat(where), os.path.realpath(where)
                except OSError:
                    continue
            if stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) not in walked:
                walked.add((st.st_dev, st.st_ino))
                stack.append(where)


def untrusted(checks: Iterable[Checked]) -> list[Untrusted]:
    """What in `checks` a user other than root could change, each component once."""
    found: list[Untrusted] = []
    seen: set[tuple[str, bool]] = set()

    def judge(check: Checked, path: str, st: os.stat_result, sticky_ok: bool = True) -> None:
        if (path, sticky_ok) in seen:
            return
        seen.add((path, sticky_ok))
        why = fault(st, sticky_ok=sticky_ok)
        if why is not None and all(u.path != path for u in found):
            found.append(
                Untrusted(check.what, check.path, path, st.st_uid, st.st_mode, why, check.advice)
            )

    for check in checks:
        components = list(chain(check.path))
        for index, (path, st) in enumerate(components):
            judge(check, path, st, not (check.strict and index == len(components) - 1))
        if check.regular_file:
            try:
                target = os.stat(check.path)  # where its links lead: what a read opens
            except OSError:
                continue  # missing: loading it says so
            if not stat.S_ISREG(target.st_mode):
                found.append(
                    Untrusted(
                        check.what,
                        check.path,
                        str(check.path),
                        target.st_uid,
                        target.st_mode,
                        "is not a regular file (root never reads a FIFO or a device as its config)",
                    )
                )
        if not check.tree:
            continue
        for path, st in tree(check.path):
            judge(check, path, st, sticky_ok=False)
            if stat.S_ISLNK(st.st_mode):
                for linked, linked_st in chain(path):
                    judge(check, linked, linked_st)
    return found


def running_paths(inventory: Path | None = None) -> list[Checked]:
    """What this interpreter runs from: its executable (through its links), the
    virtualenv (sys.prefix) whole, every import path entry (the stdlib, site-packages),
    the mlx_medic package whole (an editable install lives outside the virtualenv), and
    the inventory."""
    import mlx_medic

    checks = [Checked("interpreter", Path(sys.executable))] if sys.executable else []
    # a virtualenv is checked whole; a system prefix (/usr) only on the way to it
    checks.append(
        Checked(
            "virtualenv" if sys.prefix != sys.base_prefix else "prefix",
            Path(sys.prefix),
            tree=sys.prefix != sys.base_prefix,
        )
    )
    # `python -m` (without -I) and `-c` put the working directory on the import path: a
    # module planted there wins over the installed one.
    cwd = os.getcwd()
    checks += [
        Checked(
            "import path",
            Path(entry or cwd),
            contents=True,
            advice=CWD_ADVICE if (entry or cwd) == cwd else Checked.advice,
        )
        for entry in sys.path
    ]
    checks += [Checked("package", Path(p), tree=True) for p in mlx_medic.__path__]
    if inventory is not None:
        checks.append(Checked("inventory", Path(os.path.abspath(inventory)), regular_file=True))
    return checks


def refusal(inventory: Path | None = None, euid: int | None = None) -> list[str]:
    """Why a root exporter must not start (one line per path at fault); [] when every
    path is root's alone, or when not running as root (no one's rights to gain)."""
    if (os.geteuid() if euid is None else euid) != 0:
        return []
    return [u.describe() for u in untrusted(running_paths(inventory))]
