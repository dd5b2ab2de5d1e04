"""The node-local process model: what an MLX process is (role), which model it
serves (scope) and what it is doing (state).

Roles come from anchored command-line matching (the interpreter, then `-m
module` or the script's own name), never from a substring anywhere in the
command line, so `grep mlx_lm.server` or a uvx wrapper that mentions the module
is not mistaken for a rank. The exporter and the remediator both import this.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # types only: discovery mode never loads the inventory's schema
    from mlx_medic.inventory import Inventory, Model


class State(StrEnum):
    """The closed set of process states every platform maps onto."""

    RUNNING = "running"
    SLEEPING = "sleeping"
    UNINTERRUPTIBLE = "uninterruptible"
    STOPPED = "stopped"
    ZOMBIE = "zombie"


class Role(StrEnum):
    """What an MLX process is for; the `role` label of the process metrics."""

    LAUNCHER = "launcher"  # mlx.launch
    SSH_CLIENT = "ssh_client"  # `ssh -tt host <launch script>` started by mlx.launch
    RANK = "rank"  # mlx_lm server, a model's `rank` pattern, or anything started with MLX_RANK
    SHARE = "share"  # mlx_lm.share, or a model's `share` pattern (the seed's mlx-share-rank.py)
    EXO_RUNNER = "exo_runner"  # a multiprocessing child of exo


# Environment variables read (lazily) from scoped processes.
ENV_RANK = "MLX_RANK"
ENV_RUN_ID = "MLX_MEDIC_RUN_ID"
ENV_MODEL = "MLX_MEDIC_MODEL"
# What mlx.launch hands every rank about its launch's placement (launch.py launch_ring,
# launch_jaccl): the paths of temporary files whose content every rank of one launch
# shares, and JACCL's coordinator address. See mlx_medic.placement.
ENV_HOSTFILE = "MLX_HOSTFILE"  # ring: a mktemp file holding the ranks' ip:port lists
ENV_IBV_DEVICES = "MLX_IBV_DEVICES"  # jaccl: a mktemp file holding the RDMA device matrix
ENV_JACCL_COORDINATOR = "MLX_JACCL_COORDINATOR"  # jaccl: rank 0's ip:port
ENV_JACCL_RING = "MLX_JACCL_RING"  # jaccl-ring
PLACEMENT_ENV = (ENV_HOSTFILE, ENV_IBV_DEVICES, ENV_JACCL_COORDINATOR, ENV_JACCL_RING)
WATCHED_ENV = (ENV_RANK, ENV_RUN_ID, ENV_MODEL, *PLACEMENT_ENV)


@dataclass
class ProcessInfo:
    """One process as a table snapshot saw it.

    `env` holds only WATCHED_ENV and is read on first use: reading a process's
    environment costs a file read (Linux) or a sysctl (macOS), and most
    processes never need it.
    """

    pid: int
    ppid: int
    state: State
    cmdline: tuple[str, ...]
    create_time: float  # seconds since the epoch
    name: str = ""  # the kernel's short name (comm), e.g. "sshd"
    role: Role | None = None  # filled by the table from classify()
    env_loader: Callable[[], Mapping[str, str]] | None = field(default=None, repr=False)
    _env: Mapping[str, str] | None = field(default=None, repr=False)

    @property
    def env(self) -> Mapping[str, str]:
        if self._env is None:
            loaded: Mapping[str, str] = {}
            if self.env_loader is not None:
                try:
                    loaded = self.env_loader()
                except (OSError, ValueError):
                    loaded = {}
            self._env = {k: v for k, v in loaded.items() if k in WATCHED_ENV}
        return self._env

    @property
    def run_id(self) -> str | None:
        return self.env.get(ENV_RUN_ID) or None


def parse_environ(raw: bytes) -> dict[str, str]:
    """The watched variables from a NUL-separated environment block."""
    found: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key.decode("ascii", "replace") in WATCHED_ENV:
            found[key.decode()] = value.decode("utf-8", "replace")
    return found


# --- anchored command-line matching ---------------------------------------

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?[tw]?$", re.IGNORECASE)  # python3.11, Python
_SHELLS = {"sh", "bash", "zsh", "dash"}
# CPython options that take a separate argument (`-W error`, `-X dev`).
_PY_OPTS_WITH_ARG = {"-W", "-X", "--check-hash-based-pycs"}
# ssh options that take an argument (OpenSSH's getopt string).
_SSH_OPTS_WITH_ARG = set("BbcDEeFIiJLlmOoPpQRSWw")
# mlx.launch's remote script ends with these two statements (launch.py
# make_launch_script); the rank's own argv is the bash array.
_LAUNCH_SCRIPT = re.compile(r"""export MLX_RANK=\d+; cmd=\((?P<cmd>.*)\); exec "\$\{cmd\[@\]\}"$""")
# One shell word as shlex.quote writes it: quoted runs and plain characters, no blank or `;`.
_SCRIPT_WORD = r"""(?:'[^']*'|"[^"]*"|[^\s;'"])*"""
# `export KEY=VALUE; ` for each --env, and for each file (MLX_HOSTFILE, MLX_IBV_DEVICES)
# `fname=$(mktemp); echo CONTENT >$fname; export NAME=$fname; `.
_LAUNCH_EXPORT = re.compile(rf"export (\w+)=({_SCRIPT_WORD});")
_LAUNCH_FILE = re.compile(
    rf"fname=\$\(mktemp\); echo ({_SCRIPT_WORD}) >\$fname; export (\w+)=\$fname;"
)

_LAUNCHER_MODULES = {"mlx.launch", "mlx._distributed_utils.launch"}
_LAUNCHER_SCRIPTS = {"mlx.launch"}


@dataclass(frozen=True)
class Invocation:
    """What a command line runs: a Python module, a script, or a program."""

    kind: str  # "module" | "script" | "code" | "program"
    target: str  # module name, script basename, or program basename
    args: tuple[str, ...]  # the arguments after the target


def basename(path: str) -> str:
    """Last path component (plain string work: this runs per process per scrape)."""
    return path.rstrip("/").rpartition("/")[2]


def invocation(cmdline: Sequence[str]) -> Invocation | None:
    """Parse argv the way CPython does: interpreter options, then -m/-c/script."""
    if not cmdline:
        return None
    program = basename(cmdline[0])
    if not _PYTHON.match(program):
        return Invocation("program", program, tuple(cmdline[1:]))
    index = 1
    while index < len(cmdline):
        arg = cmdline[index]
        if arg == "-m" and index + 1 < len(cmdline):
            return Invocation("module", cmdline[index + 1], tuple(cmdline[index + 2 :]))
        if arg.startswith("-m") and len(arg) > 2:
            return Invocation("module", arg[2:], tuple(cmdline[index + 1 :]))
        if arg == "-c" or arg.startswith("-c"):
            return Invocation("code", "", tuple(cmdline[index + 1 :]))
        if arg in _PY_OPTS_WITH_ARG:
            index += 2
            continue
        if arg == "-" or not arg.startswith("-"):
            return Invocation("script", basename(arg), tuple(cmdline[index + 1 :]))
        index += 1
    return Invocation("program", program, ())


def ssh_destination(cmdline: Sequence[str]) -> str | None:
    """The host an ssh client connects to (`user@` stripped)."""
    argv = _ssh_argv(cmdline)
    if argv is None:
        return None
    cmdline = argv
    index = 1
    while index < len(cmdline):
        arg = cmdline[index]
        if arg == "--":
            index += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        letters = arg[1:]
        for position, letter in enumerate(letters):
            if letter in _SSH_OPTS_WITH_ARG:
                if position == len(letters) - 1:
                    index += 1  # the argument is the next word
                break
        index += 1
    if index >= len(cmdline):
        return None
    return cmdline[index].rpartition("@")[2]


def _ssh_argv(cmdline: Sequence[str]) -> Sequence[str] | None:
    """argv of an ssh client, also through a shell wrapper named `ssh`."""
    if not cmdline:
        return None
    if basename(cmdline[0]) == "ssh":
        return cmdline
    if basename(cmdline[0]) in _SHELLS and len(cmdline) > 1 and basename(cmdline[1]) == "ssh":
        return cmdline[1:]
    return None


def launched_command(cmdline: Sequence[str]) -> tuple[str, ...] | None:
    """The rank argv inside an `ssh ... <mlx.launch script>` command line."""
    argv = _ssh_argv(cmdline)
    if argv is None or len(argv) < 2:
        return None
    match = _LAUNCH_SCRIPT.search(argv[-1])
    if match is None:
        return None
    try:
        return tuple(shlex.split(match.group("cmd")))
    except ValueError:
        return None


@dataclass(frozen=True)
class LaunchScript:
    """What an ssh client's mlx.launch script hands the rank it starts on the peer."""

    exports: dict[str, str]  # `export KEY=VALUE` (MLX_RANK, each --env), unquoted
    files: dict[str, str]  # variable -> the content of the mktemp file it names


def _unquote(word: str) -> str | None:
    try:
        words = shlex.split(word)
    except ValueError:
        return None
    return words[0] if words else ""


def launch_script(cmdline: Sequence[str]) -> LaunchScript | None:
    """The launch script of an ssh client started by mlx.launch, or None."""
    argv = _ssh_argv(cmdline)
    if not argv or launched_command(cmdline) is None:
        return None
    script = argv[-1]
    exports: dict[str, str] = {}
    for key, raw in _LAUNCH_EXPORT.findall(script):
        value = _unquote(raw)
        if value is not None and raw != "$fname":
            exports[key] = value
    files: dict[str, str] = {}
    for raw, key in _LAUNCH_FILE.findall(script):
        content = _unquote(raw)
        if content is not None:
            files[key] = content
    return LaunchScript(exports, files)


def launch_script_env(cmdline: Sequence[str]) -> dict[str, str]:
    """Run-id variables an ssh client's launch script exports on the peer."""
    script = launch_script(cmdline)
    if script is None:
        return {}
    return {k: v for k, v in script.exports.items() if k in (ENV_RUN_ID, ENV_MODEL)}


def command_text(cmdline: Sequence[str]) -> str | None:
    """What a model's process patterns are matched against: what runs, then its arguments,
    joined by single spaces.

    What runs is the script's file name (`python3 /opt/seed/serve.py` -> `serve.py`), the
    module after `-m` (`mlx_lm.server`), or the program's file name. The interpreter and its
    options are left out, so one pattern fits whichever Python runs the script; `python -c
    CODE` has no text (code is never a model's process). A pattern must match all of it
    (`re.fullmatch`), so `grep serve.py`, `bash -c '... serve.py'` or `serve.py.bak` never
    match `serve\\.py .*`.
    """
    inv = invocation(cmdline)
    if inv is None or inv.kind == "code" or not inv.target:
        return None
    return " ".join((inv.target, *inv.args))


@dataclass(frozen=True)
class ProcessPattern:
    """One of a model's `process_patterns`: a command that is the model's `role`."""

    model: str
    role: Role
    regex: re.Pattern[str]

    def matches(self, text: str) -> bool:
        return self.regex.fullmatch(text) is not None


class PatternSet:
    """Every model's process patterns, matched in inventory order (the first match wins)."""

    def __init__(self, patterns: Iterable[ProcessPattern] = ()):
        self.patterns = tuple(patterns)

    @classmethod
    def of(cls, inventory: Inventory | None) -> PatternSet:
        found = []
        for model in inventory.models if inventory is not None else ():
            for role, regex in model.process_patterns.compiled():
                found.append(ProcessPattern(model.name, Role(role), regex))
        return cls(found)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def match(self, cmdline: Sequence[str]) -> ProcessPattern | None:
        if not self.patterns:
            return None
        text = command_text(cmdline)
        if text is None:
            return None
        return next((p for p in self.patterns if p.matches(text)), None)


NO_PATTERNS = PatternSet()


def _mlx_lm_role(inv: Invocation) -> Role | None:
    """`-m mlx_lm.server`, `-m mlx_lm server`, and the `mlx_lm.server` script."""
    target = inv.target
    if inv.kind not in ("module", "script", "program"):
        return None
    sub = inv.args[0] if inv.args else ""
    if target in ("mlx_lm.server", "mlx_lm.server.py") or (target == "mlx_lm" and sub == "server"):
        return Role.RANK
    if target in ("mlx_lm.share", "mlx_lm.share.py") or (target == "mlx_lm" and sub == "share"):
        return Role.SHARE
    return None


def classify_cmdline(cmdline: Sequence[str]) -> Role | None:
    """The role a command line alone proves, or None.

    Ranks started by mlx.launch under another name (the seed's `serve.py`) are found by
    their model's process patterns, else through MLX_RANK; see `classify`.
    """
    inv = invocation(cmdline)
    if inv is None:
        return None
    if (inv.kind == "module" and inv.target in _LAUNCHER_MODULES) or (
        inv.kind in ("script", "program") and inv.target in _LAUNCHER_SCRIPTS
    ):
        return Role.LAUNCHER
    if launched_command(cmdline) is not None:
        return Role.SSH_CLIENT
    return _mlx_lm_role(inv)


def classify(
    cmdline: Sequence[str],
    env: Callable[[], Mapping[str, str]],
    patterns: PatternSet = NO_PATTERNS,
) -> Role | None:
    """Role from the command line (mlx.launch, its ssh clients, mlx_lm), else from the
    inventory's process patterns, else RANK if it was started with MLX_RANK."""
    role = classify_cmdline(cmdline)
    if role is not None:
        return role
    if is_exo_spawn_child(cmdline) or is_exo_main(cmdline):
        return None  # decided by ancestry in resolve_exo_runners
    found = patterns.match(cmdline)
    if found is not None:
        return found.role
    return Role.RANK if ENV_RANK in env() else None


Classifier = Callable[[Sequence[str], Callable[[], Mapping[str, str]]], Role | None]


def classifier(patterns: PatternSet) -> Classifier:
    """`classify` with the inventory's process patterns, for a process table."""
    if not patterns:
        return classify
    return lambda cmdline, env: classify(cmdline, env, patterns)


def is_exo_main(cmdline: Sequence[str]) -> bool:
    inv = invocation(cmdline)
    if inv is None:
        return False
    if inv.kind == "module":
        return inv.target == "exo" or inv.target.startswith("exo.main")
    return inv.kind in ("script", "program") and inv.target == "exo"


def is_exo_interpreter(cmdline: Sequence[str]) -> bool:
    """An interpreter inside an exo install (`/opt/exo/.venv/bin/python`): how a runner
    whose exo parent is already gone is still known for what it is."""
    if not cmdline:
        return False
    parts = PurePosixPath(cmdline[0]).parts[:-1]
    return any(p == "exo" or p.startswith(("exo-", "exo_", "exo.")) for p in parts)


def is_exo_spawn_child(cmdline: Sequence[str]) -> bool:
    """A multiprocessing spawn child (what exo starts runners as)."""
    inv = invocation(cmdline)
    return (
        inv is not None
        and inv.kind == "code"
        and "--multiprocessing-fork" in inv.args
        and "spawn_main" in inv.args[0]  # the -c code, after any interpreter flags (-B, -s)
    )


# --- scope: which model a process belongs to -----------------------------------

UNKNOWN_MODEL = "unknown"
EXO_MODEL = "exo"


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag V` or `--flag=V` (the last one wins, as argparse does)."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def scope_argv(proc_cmdline: Sequence[str]) -> tuple[str, ...]:
    """The argv that says what a process serves: the rank's own for ssh clients."""
    return launched_command(proc_cmdline) or tuple(proc_cmdline)


def under_any(path: str, roots: Iterable[os.PathLike[str] | str]) -> bool:
    """An absolute path at or below one of `roots` (lexically: no link is resolved)."""
    if not path.startswith("/"):
        return False
    candidate = PurePosixPath(os.path.normpath(path))
    for root in roots:
        root_path = PurePosixPath(str(root))
        if candidate == root_path or root_path in candidate.parents:
            return True
    return False


class ModelScoper:
    """Puts a process in a model's scope.

    With an inventory: the run tag's model, else the model whose process patterns match
    (for an ssh client: the rank command it launches), else the serving port (`--port`),
    else an argument under the model's tmp dirs, else the `--model` path. A process on a
    port no model serves stays out of scope even if its `--model` matches: a manual test
    server is not the service's rank. Without an inventory, processes are grouped by their
    `--model` argument.
    """

    def __init__(self, inventory: Inventory | None):
        self.models: list[Model] = list(inventory.models) if inventory else []
        self.discovery = inventory is None or not self.models
        self.patterns = PatternSet.of(inventory)

    def model_of(self, proc: ProcessInfo) -> str | None:
        if proc.role is Role.EXO_RUNNER:
            return EXO_MODEL  # exo places models itself; its runners carry no model argument
        argv = scope_argv(proc.cmdline)
        tagged = proc.env.get(ENV_MODEL) or launch_script_env(proc.cmdline).get(ENV_MODEL)
        model_arg = flag_value(argv, "--model")
        if self.discovery:
            return tagged or model_arg or UNKNOWN_MODEL
        names = {m.name for m in self.models}
        if tagged in names:
            return tagged
        matched = self.patterns.match(argv)
        if matched is not None:
            return matched.model
        port = flag_value(argv, "--port")
        if port is not None:
            by_port = [m for m in self.models if str(m.port) == port]
            if len(by_port) > 1 and model_arg is not None:
                by_port = [m for m in by_port if m.model == model_arg] or by_port
            return by_port[0].name if by_port else None
        for model in self.models:
            if model.tmp_dirs and any(under_any(arg, model.tmp_dirs) for arg in argv):
                return model.name
        by_path = [m for m in self.models if model_arg is not None and m.model == model_arg]
        return by_path[0].name if len(by_path) == 1 else None


# --- ancestry over a snapshot --------------------------------------------------


def by_pid(processes: Iterable[ProcessInfo]) -> dict[int, ProcessInfo]:
    return {p.pid: p for p in processes}


def ancestors(proc: ProcessInfo, table: Mapping[int, ProcessInfo]) -> list[ProcessInfo]:
    """Parent, grandparent, ... as far as the snapshot knows them."""
    found: list[ProcessInfo] = []
    seen = {proc.pid}
    pid = proc.ppid
    while pid in table and pid not in seen:
        seen.add(pid)
        parent = table[pid]
        found.append(parent)
        pid = parent.ppid
    return found


def is_sshd_session(proc: ProcessInfo) -> bool:
    """An sshd serving one connection (`sshd: root@pts/0`, `sshd-session`).

    The listener (`sshd: /usr/sbin/sshd -D [listener] ...`) is not: it never
    holds a client's connection, and in the testbed it is pid 1, adopting
    orphans as launchd would.
    """
    first = proc.cmdline[0] if proc.cmdline else ""
    if "[listener]" in first:
        return False
    if basename(first) == "sshd-session" or first.startswith(("sshd:", "sshd-session:")):
        return True
    return proc.name == "sshd-session"


def has_exo_ancestor(proc: ProcessInfo, table: Mapping[int, ProcessInfo]) -> bool:
    return any(is_exo_main(a.cmdline) for a in ancestors(proc, table))


def resolve_exo_runners(table: Mapping[int, ProcessInfo]) -> None:
    """Spawn children under an exo main process, or run by exo's own interpreter
    (an orphan whose exo parent is gone), are exo runners."""
    for proc in table.values():
        if (
            proc.role is None
            and is_exo_spawn_child(proc.cmdline)
            and (is_exo_interpreter(proc.cmdline) or has_exo_ancestor(proc, table))
        ):
            proc.role = Role.EXO_RUNNER


# --- process tables -------------------------------------------------------------


class ProcessTable(Protocol):
    """A platform's view of the process table.

    `snapshot()` returns the processes that have a role (or may get one from
    their ancestry) plus all their ancestors; unrelated processes are left out,
    which is what keeps a scrape cheap on a busy node.
    """

    def snapshot(self) -> list[ProcessInfo]: ...


# A command line can change without a new pid: `bash -c '...; exec python -m
# mlx_lm.server'` (mlx.launch's own launch script) and pyenv shims exec into
# the rank. Tables cache classification per process, so they look again at
# these ages (seconds since first seen), then every RECHECK_EVERY seconds.
RECHECK_AFTER = (1.0, 5.0, 30.0, 120.0)
RECHECK_EVERY = 600.0


def next_check(first_seen: float, checks_done: int) -> float:
    """When a cached classification should be looked at again."""
    if checks_done < len(RECHECK_AFTER):
        return first_seen + RECHECK_AFTER[checks_done]
    extra = checks_done - len(RECHECK_AFTER) + 1
    return first_seen + RECHECK_AFTER[-1] + extra * RECHECK_EVERY
