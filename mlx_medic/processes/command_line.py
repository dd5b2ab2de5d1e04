"""What a command line runs, read the way its program reads it.

The interpreter's options, then `-m module`, `-c` or the script (`invocation`); an ssh
client's destination; the rank command and the exported variables inside the launch
script mlx.launch hands its ssh clients; the text a model's process patterns match
(`command_text`); a flag's value. Plain string work: it runs per process per scrape.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from mlx_medic.processes.info import ENV_MODEL, ENV_RUN_ID

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


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag V` or `--flag=V` (the last one wins, as argparse does)."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value
