"""What the deployment puts on a node and the project relies on: mlx-medic at the path the
inventory names, the inventory where the helpers read it, MLX in the ranks' interpreter,
the sudo rule and the keys' forced command as `mlx-medic render` writes them, and an
exporter that can see the service user's processes and listening sockets."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from mlx_medic.command_line import version
from mlx_medic.doctor.commands import VERSIONED_PACKAGES, VERSIONS_SCRIPT
from mlx_medic.doctor.framework import (
    DoctorContext,
    Outcome,
    check,
    failed,
    not_applicable,
    passed,
    skipped,
)
from mlx_medic.doctor.keys_and_sudo import parse_key_options, parse_sudo_listing
from mlx_medic.platform.commands import CommandError, CommandNotFound, ParseError, excerpt

TIMEOUT = 30.0
BOTH = ("darwin", "linux")
SAME_VERSION = "install one mlx-medic version on every node and on the remediator's host"
INSTALL_SUDOERS = (
    "install this node's file from `mlx-medic render sudoers` as /etc/sudoers.d/mlx-medic"
    " (root, 0440; check it with `visudo -cf FILE`)"
)
INSTALL_SUDO = (
    "install sudo (macOS ships it as /usr/bin/sudo; Debian: `apt-get install sudo`), then "
    + INSTALL_SUDOERS
)
INSTALL_KEYS = "install this node's `mlx-medic render authorized-keys` file as {path}"
AS_EXPORTER = (
    "run the exporter as root, as the rendered launchd job and systemd unit do; run the"
    " doctor as the exporter's user to check what it sees"
)


@check(
    "medic-command",
    BOTH,
    "the node's medic_command is an absolute path that runs this mlx-medic version (the"
    " remediator's SSH commands and the rendered services start it)",
    needs_node=True,
)
def medic_command_runs(context: DoctorContext) -> Iterator[Outcome]:
    from mlx_medic.render.files import RenderError
    from mlx_medic.render.services import medic_command

    node = context.this_node
    try:
        command = medic_command(node)
        result = context.runner()((command, "--version"), TIMEOUT)
    except RenderError as exc:
        yield failed(str(exc), f"set nodes.{node.name}.medic_command to mlx-medic's full path")
        return
    except CommandNotFound:
        yield failed(f"{command} is not installed", SAME_VERSION)
        return
    except CommandError as exc:
        yield failed(str(exc), SAME_VERSION)
        return
    said = result.stdout.strip()
    if result.returncode != 0 or said != f"mlx-medic {version()}":
        yield failed(
            f"`{command} --version` printed {excerpt(said or result.stderr)} (exit"
            f" {result.returncode}); this doctor is mlx-medic {version()}",
            SAME_VERSION,
        )
        return
    yield passed(f"{command}: {said}")


@check(
    "medic-config",
    BOTH,
    "the node's medic_config holds this inventory (the node helpers and the rendered"
    " services read it there)",
    needs_node=True,
)
def medic_config(context: DoctorContext) -> Iterator[Outcome]:
    given = context.inventory_path
    if given is None:
        yield skipped("the inventory was not read from a file")
        return
    there = context.this_node.medic_config
    copy = f"copy {given} to {there} on every node"
    try:
        same = os.path.samefile(there, given) or there.read_bytes() == given.read_bytes()
    except FileNotFoundError:
        yield failed(f"{there} does not exist", copy)
        return
    except OSError as exc:
        yield failed(f"{there} cannot be read: {exc.strerror or exc}", copy)
        return
    yield (
        passed(f"{there} holds {given}") if same else failed(f"{there} differs from {given}", copy)
    )


@check(
    "interpreter",
    BOTH,
    "the interpreter the ranks start with (serve.python, else the one running mlx-medic"
    " serve) imports mlx and mlx-lm, and this mlx-medic (the rank guard runs in it)",
    needs_node=True,
)
def interpreter(context: DoctorContext) -> Iterator[Outcome]:
    import sys

    pythons: dict[str, list[str]] = {}
    for model in context.models_here():
        python = str(model.serve.python) if model.serve.python else sys.executable
        pythons.setdefault(python, []).append(model.name)
    if not pythons:
        yield not_applicable("no model is placed on this node")
    for python, models in pythons.items():
        yield interpreter_versions(context, python, f"for {', '.join(models)}")


def interpreter_versions(context: DoctorContext, python: str, which: str) -> Outcome:
    install = f"`{python} -m pip install mlx mlx-lm mlx-medic=={version()}` ({SAME_VERSION})"
    try:
        result = context.runner()((python, "-c", VERSIONS_SCRIPT, *VERSIONED_PACKAGES), TIMEOUT)
        if result.returncode != 0:
            raise CommandError(f"`{python}` exited {result.returncode}: {excerpt(result.stderr)}")
        found = json.loads(result.stdout)
    except (CommandError, ValueError) as exc:
        return failed(f"{exc} ({which})", install, python)
    missing = [name for name in VERSIONED_PACKAGES if not found.get(name)]
    versions = ", ".join(f"{name} {found.get(name)}" for name in VERSIONED_PACKAGES)
    said = f"Python {found.get('python')}, {versions} ({which})"
    if missing:
        return failed(f"{', '.join(missing)} not installed: {said}", install, python)
    if found["mlx-medic"] != version():
        return failed(f"{said}; this doctor is mlx-medic {version()}", install, python)
    return passed(said, python)


@check(
    "sudo-rule",
    BOTH,
    "`sudo -n -l` as the login user lists exactly the rule `mlx-medic render sudoers`"
    " writes: the service-manager commands of the models headed here, as root, without a"
    " password, and nothing else",
    unverified="the `sudo -l` listing the check reads was captured from Debian's sudo"
    " 1.9.13p3 (tests/fixtures/sudo/); macOS's own sudo was never seen printing it",
    needs_node=True,
)
def sudo_rule(context: DoctorContext) -> Iterator[Outcome]:
    from mlx_medic.render.files import RenderError
    from mlx_medic.render.sudoers import rule_commands

    node = context.this_node
    try:
        expected = [c for m in context.models_headed_here() for c in rule_commands(m)]
    except RenderError as exc:
        yield failed(str(exc), "render refuses this inventory's rule: fix the field it names")
        return
    if not expected:
        yield not_applicable("no model headed here runs its service manager through sudo")
        return
    login = node.user
    if context.user == login:
        argv: tuple[str, ...] = ("sudo", "-n", "-l")
    elif context.user == "root":
        argv = ("sudo", "-n", "-l", "-U", login)
    else:
        yield skipped(f"sudo -l lists the asking user's rules: run the doctor as {login} or root")
        return
    try:
        result = context.runner()(argv, TIMEOUT)
        said = result.stdout + result.stderr
        if result.returncode != 0:
            raise CommandError(f"`{' '.join(argv)}` exited {result.returncode}: {excerpt(said)}")
        rules = parse_sudo_listing(result.stdout)
    except CommandNotFound:
        yield failed(
            f"sudo is not installed (not found on PATH): {login} cannot run the rendered"
            " rule's service-manager commands as root",
            INSTALL_SUDO,
        )
        return
    except (CommandError, ParseError) as exc:
        yield failed(f"{login} has no sudo rule here: {exc}", INSTALL_SUDOERS)
        return
    ours = [r.command for r in rules if r.runas == "root" and "NOPASSWD" in r.tags]
    missing = [c for c in expected if c not in ours]
    extra = [
        f"({r.runas}) {''.join(t + ': ' for t in r.tags)}{r.command}"
        for r in rules
        if not (r.runas == "root" and "NOPASSWD" in r.tags and r.command in expected)
    ]
    problems = [f"{login} may not run without a password: {c}" for c in missing]
    problems += [f"{login} may also run: {e}" for e in extra]
    if problems:
        fix = INSTALL_SUDOERS + "; the login user needs that rule and nothing else"
        yield failed("; ".join(problems), fix)
        return
    yield passed(f"{login} may run exactly the {len(expected)} rendered commands")


@check(
    "forced-command",
    BOTH,
    "the login user's ~/.ssh/authorized_keys pins the remediator's key (and the serve"
    " wrapper's, on a model's peers) to `mlx-medic node forced-command` with the options"
    " and from= addresses `mlx-medic render authorized-keys` writes",
    needs_node=True,
)
def forced_command(context: DoctorContext) -> Iterator[Outcome]:
    from mlx_medic.render import authorized_keys as keys
    from mlx_medic.render.files import RenderError
    from mlx_medic.render.services import medic_command

    node, inventory = context.this_node, context.inventory
    assert inventory is not None  # needs_node
    if missing := keys.missing_in_inventory(inventory):
        setting, why = missing[0]
        yield failed(f"the inventory lacks {setting}", f"set it: {why}")
        return
    try:
        path = context.home_of(node.user) / ".ssh" / "authorized_keys"
        text = path.read_text(encoding="utf-8")
        medic = medic_command(node)
    except KeyError:
        yield failed(f"there is no user {node.user} here", f"create the login user {node.user}")
        return
    except FileNotFoundError:
        yield failed(f"{path} does not exist", INSTALL_KEYS.format(path=path))
        return
    except PermissionError:
        yield skipped(f"{context.user} cannot read {path}: run the doctor as root or {node.user}")
        return
    except (OSError, RenderError) as exc:
        yield failed(str(exc), INSTALL_KEYS.format(path=path))
        return
    expected = {"remediator": list(inventory.ssh.remediator_addresses)}
    wrapper_keys = {  # models whose wrapper logs in to its peers with a key of its own
        m.name: str(m.serve.identity_file) for m in inventory.models if m.serve.identity_file
    }
    heads = keys.serve_key_heads(inventory, wrapper_keys).get(node.name, {})
    if heads:
        expected["serve"] = list(dict.fromkeys(a for group in heads.values() for a in group))
    lines = [
        parse_key_options(line)
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    problems = []
    for key, addresses in expected.items():
        command = keys.forced_command(medic, str(node.medic_config), key)
        found = [line for line in lines if line.command == command]
        if not found:
            problems.append(f"no key line runs `{command}`")
            continue
        for line in found:
            written = keys.key_options(command, line.addresses)
            if line.text != written:
                problems.append(f"the {key} key's options are `{line.text}`, not `{written}`")
        allowed = {a for line in found for a in line.addresses}
        if lacking := [a for a in addresses if a not in allowed]:
            problems.append(f"the {key} key's from= lacks {', '.join(lacking)}")
        if wider := sorted(allowed - set(addresses)):
            problems.append(f"the {key} key's from= also allows {', '.join(wider)}")
    if problems:
        yield failed(f"{path}: {'; '.join(problems)}", INSTALL_KEYS.format(path=path))
        return
    pinned = {keys.forced_command(medic, str(node.medic_config), k) for k in expected}
    others = sum(1 for line in lines if line.command not in pinned)
    note = f"; {others} other key line(s) run something else" if others else ""
    yield passed(f"{path}: the {' and '.join(expected)} keys run the forced command{note}")


def processes_of(context: DoctorContext, user: str | None) -> list[Any]:
    """The processes of `user` (None: every process), as psutil lists them."""
    return [
        p
        for p in context.process_iter(["pid", "username"])
        if user is None or p.info.get("username") == user
    ]


@check(
    "process-visibility",
    BOTH,
    "the exporter (root) reads the command line and environment of the service user's"
    " processes, which tell a model's ranks and orphans apart",
    unverified="on macOS, root reading another user's command lines and environments"
    " through psutil was never run on a real Mac",
    needs_node=True,
)
def process_visibility(context: DoctorContext) -> Iterator[Outcome]:
    import psutil

    users = dict.fromkeys(m.service.user for m in context.models_here())
    if not users:
        yield not_applicable("no model is placed on this node")
    for user in users:
        if user is None or user == context.user:
            yield passed(f"the ranks run as {context.user}, whose processes it sees", user or "")
            continue
        found = processes_of(context, user)
        denied = []
        for process in found:
            try:
                process.cmdline()
                process.environ()
            except psutil.AccessDenied:
                denied.append(process.pid)
            except psutil.NoSuchProcess:
                continue
        if not found:
            yield skipped(f"no process of {user} runs now: run again while a model serves", user)
        elif denied:
            yield failed(
                f"as {context.user}, {len(denied)} of {len(found)} of {user}'s processes refuse"
                f" their command line or environment (pid {denied[0]})",
                AS_EXPORTER,
                user,
            )
        else:
            yield passed(f"as {context.user}: all {len(found)} of {user}'s processes", user)


@check(
    "listening-sockets",
    BOTH,
    "the exporter sees which process listens on each model's port on its head (the rank"
    " that serves is never an orphan)",
    unverified="on macOS, psutil listing another user's sockets as root was never run on a"
    " real Mac",
    needs_node=True,
)
def listening_sockets(context: DoctorContext) -> Iterator[Outcome]:
    models = context.models_headed_here()
    if not models:
        yield not_applicable("no model has its head here")
        return
    probe = context.listening()
    for model in models:
        user, port = model.service.user, model.port
        answers = {p.pid: probe(p.pid, port) for p in processes_of(context, user)}
        listening = [pid for pid, answer in answers.items() if answer]
        unknown = [pid for pid, answer in answers.items() if answer is None]
        whose = f"{user}'s" if user else "any user's"
        if listening:
            yield passed(f"pid {listening[0]} listens on port {port}", model.name)
        elif unknown:
            yield failed(
                f"as {context.user}, cannot tell whether {len(unknown)} of {whose} processes"
                f" listen on port {port} (pid {unknown[0]})",
                AS_EXPORTER,
                model.name,
            )
        else:
            yield skipped(
                f"none of {whose} processes listens on port {port} now: run again while"
                " the model serves",
                model.name,
            )
