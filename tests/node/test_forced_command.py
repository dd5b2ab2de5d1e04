"""The forced command's validator: only `mlx-medic node <helper>` (the probe too),
with options whose values the inventory allows, and of those only the command lines the
key's own user sends (mlx_medic.node.key_table); everything else refused, saying why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.node.forced_command import (
    Allowed,
    Refused,
    add_arguments,
    helper_names,
    validate,
)
from mlx_medic.node.key_table import KEYS
from tests.node.inventories import two_models

CONFIG = Path("/etc/mlx-medic/inventory.yaml")
INVENTORY = parse_inventory(
    two_models(n1=", medic_command: /opt/mlx-medic/bin/mlx-medic", m2="\n    host: 0.0.0.0")
)
ALLOWED = Allowed(INVENTORY, CONFIG, "n1")  # the remediator's key, the default
SERVE_ON_PEER = Allowed(INVENTORY, CONFIG, "n2", key="serve")  # m1's head is n1
RUN = "20261130T021500Z-1a2b3c4d"
TOKEN = "0123456789abcdef"


def check(line: str, allowed: Allowed = ALLOWED) -> list[str]:
    return validate(line, allowed)


def lock_info(**fields: object) -> str:
    info = {
        "node": None,
        "pid": 42,
        "pid_start": 1.5,
        "host": "replica-a",
        "time": 1.0,
        "holder": "remediator",
        "run_id": "12",
        "expires": 91.0,
        "token": TOKEN,
    }
    return json.dumps({**info, **fields}, sort_keys=True)


def test_a_node_helper_runs_with_the_keys_own_inventory() -> None:
    assert check("mlx-medic node facts m1 --json") == [
        "node",
        "facts",
        "m1",
        "--json",
        "--inventory",
        str(CONFIG),
    ]
    assert check("/opt/mlx-medic/bin/mlx-medic node facts m1 --node n1 --json")[:6] == [
        "node",
        "facts",
        "m1",
        "--node",
        "n1",
        "--json",
    ]
    line = f"mlx-medic node clean m1 --inventory={CONFIG} --state-dir /var/lib/mlx-medic/"
    assert check(line) == [
        "node",
        "clean",
        "m1",
        f"--inventory={CONFIG}",
        "--state-dir",
        "/var/lib/mlx-medic/",
    ]


def test_the_probe_runs_for_a_model_placed_here_as_the_remediator_asks() -> None:
    assert check("mlx-medic node probe m1 --timeout 10") == [
        "node",
        "probe",
        "m1",
        "--timeout",
        "10",
        "--inventory",
        str(CONFIG),
    ]
    on_n2 = Allowed(INVENTORY, CONFIG, "n2")  # m2 listens on 0.0.0.0: its head says where
    assert check("mlx-medic node probe m2 --timeout 10", on_n2)[:3] == ["node", "probe", "m2"]


# One command line per grant of each key, as its sender writes it (NodeHelpers adds the
# same tail); tests/node/test_key_table.py checks them against the real senders.
REMEDIATOR_SENDS = [
    "node facts m1",
    "node orphans m1",
    "node sweep m1",
    "node sweep m1 --orphans-only",
    "node clean m1",
    "node service m1 stop --by 'remediator run 12 (pid 4242 on medic-a.example)'"
    " --reason 'm1 is down: stop, sweep'",
    "node service m1 stop --by 'remediator run 12' --reason 'm1 is down: stop, sweep'",
    "node service m1 start",
    "node service m1 restart",
    "node service m1 status",
    "node backend m1 set ring --by 'remediator run 12' --reason 'JACCL failed'",
    f"node lock m1 take --info '{lock_info()}'",
    f"node lock m1 take --info '{lock_info(holder='manual', node='n2')}'",
    "node lock m1 show",
    f"node lock m1 replace --expected-token {TOKEN} --info '{lock_info()}'",
    f"node lock m1 release --token {TOKEN}",
    f"node lock m1 break --expected-sha256 {'ab' * 32}",
    "node pid-alive 4242 --start-time 1796084792.5",
    "node pid-alive 4242",
    "node probe m1 --timeout 10",
]
SERVE_SENDS = [
    "node sweep m1 --start-sweep --grace 0.25",
    f"node sweep m1 --start-sweep --grace 0.25 --crashed-run {RUN}",
    f"node sweep m1 --run {RUN}",
    f"node sweep m1 --run {RUN} --grace 0.25",
    "node clean m1",
    f"node run m1 set {RUN} --lease 10 --holder 'serve pid 7 on n1'",
    f"node run m1 renew {RUN} --lease 10 --holder 'serve pid 7 on n1'",
    f"node run m1 clear {RUN}",
    "node pid-alive 4242 --start-time 1796084792.5",
]
TAIL = f" --inventory {CONFIG} --node {{node}} --json --time-limit 120"  # as NodeHelpers sends


@pytest.mark.parametrize("line", REMEDIATOR_SENDS)
def test_what_the_remediator_sends_passes_its_key(line: str) -> None:
    argv = check(f"mlx-medic {line}{TAIL.format(node='n1')}")
    assert argv[:2] == line.split()[:2] and argv[-3:] == ["--json", "--time-limit", "120"]


@pytest.mark.parametrize("line", SERVE_SENDS)
def test_what_the_serve_wrapper_sends_to_a_peer_passes_its_key(line: str) -> None:
    argv = check(f"mlx-medic {line}{TAIL.format(node='n2')}", SERVE_ON_PEER)
    assert argv[:2] == line.split()[:2] and argv[-3:] == ["--json", "--time-limit", "120"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("", "no command given"),
        ("sh -c 'mlx-medic node facts m1'", "'sh' is not mlx-medic"),
        ("mlx-medic node facts m1 --json; rm -rf /", "unrecognized arguments: --json; rm -rf /"),
        ("mlx-medic node facts m1 --json ; id", "unrecognized arguments: ; id"),
        ("mlx-medic node facts m1 && id", "unrecognized arguments: && id"),
        ("mlx-medic node facts m1 $(id)", "unrecognized arguments: $(id)"),
        ("mlx-medic node facts 'unclosed", "cannot split"),
        ("/tmp/mlx-medic node facts m1", "'/tmp/mlx-medic' is not mlx-medic"),
        (
            "mlx-medic node shutdown",
            "'node shutdown' is not allowed for the remediator key (helpers: backend, clean,",
        ),
        ("mlx-medic node forced-command", "'node forced-command' is not allowed"),
        ("mlx-medic node", "no node helper"),
        ("mlx-medic remediate m1", "'remediate' is not allowed"),
        ("mlx-medic", "no mlx-medic subcommand"),
        ("mlx-medic node facts m1 --inventory /tmp/evil.yaml", "not the inventory's"),
        ("mlx-medic node facts m1 --state-dir /etc", "not the inventory's"),
        ("mlx-medic node facts m1 --state-dir /var/lib/mlx-medic/../../etc", "not the inventory's"),
        ("mlx-medic node facts m1 --node n9", "--node 'n9' is not this node (n1)"),
        ("mlx-medic node facts m1 --node n2", "--node 'n2' is not this node (n1)"),
        ("mlx-medic node facts m1 --node", "argument --node: expected one argument"),
        ("mlx-medic node facts m1 --json --json", "given twice"),
        ("mlx-medic node facts m1 --json=yes", "ignored explicit argument 'yes'"),
        ("mlx-medic node facts m1 --conf /etc/mlx-medic/inventory.yaml", "unrecognized arguments"),
        ("mlx-medic node facts m1 --help", "unrecognized arguments: --help"),
        ("mlx-medic node facts m2", "'m2' is not an inventory model placed on n1"),
        ("mlx-medic node service m9 status", "'m9' is not an inventory model placed on n1"),
        ("mlx-medic node service m1 reboot", "invalid choice: 'reboot'"),
        ("mlx-medic node service m1 stop", "required: --by"),
        ("mlx-medic node lock m1 show --inventory /tmp/evil.yaml", "not the inventory's"),
        (  # the probe is a node helper now: the old line, and any address, are refused
            "mlx-medic probe --host 127.0.0.1 --port 8080 --timeout 10"
            " --lock-dir /var/lib/mlx-medic/locks",
            "'probe' is not allowed (allowed: node HELPER)",
        ),
        ("mlx-medic node probe m1 --timeout 10 --host 10.0.0.1", "unrecognized arguments"),
        ("mlx-medic node probe m1 --timeout 10 --lock-dir /tmp", "unrecognized arguments"),
        ("mlx-medic node probe m2 --timeout 10", "'m2' is not an inventory model placed on n1"),
        ("mlx-medic node probe m1", "needs --timeout"),
        ("mlx-medic node probe m1 --timeout inf", "must be a positive number of seconds"),
        ("mlx-medic node probe m1 --timeout 601", "not between"),
    ],
)
def test_anything_else_is_refused_saying_why(line: str, reason: str) -> None:
    with pytest.raises(Refused) as refused:
        check(line)
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        # helpers the remediator never runs
        ("node ledger", "'node ledger' is not allowed for the remediator key"),
        (f"node run m1 set {RUN}", "'node run' is not allowed for the remediator key"),
        # a helper it runs, with what only the serve wrapper sends, or nobody
        ("node sweep m1 --start-sweep", "never sends --start-sweep"),
        ("node sweep m1 --start-sweep=1", "ignored explicit argument '1'"),
        (f"node sweep m1 --run {RUN}", "never sends --run"),
        ("node sweep m1 --dry-run --grace 1", "never sends --grace"),  # the doctor's, bare
        ("node facts m1 --lines 500", "never sends --lines"),
        ("node facts", "needs MODEL"),
        ("node service m1 start --by someone", "never sends --by"),
        (
            "node service m1 stop --by 'alice at a terminal' --reason x",
            "'alice at a terminal' is not a remediator run",
        ),
        (
            "node service m1 stop --by 'remediator run 12 (pid 1 on a b)' --reason x",
            "is not a remediator run",
        ),
        (
            "node service m1 stop --by 'remediator run 12' --reason 'a\nb'",
            "one line of at most 500",
        ),
        (
            "node service m1 stop --by 'remediator run 12' --reason x --timeout 1",
            "never sends --timeout",
        ),
        ("node backend m1 set jaccl --by 'remediator run 12' --reason x", "'jaccl' is not 'ring'"),
        # the model lock: only the engine's own holders and shapes
        (
            f"node lock m1 take --info '{lock_info(holder='serve')}'",
            "holder 'serve' is not the remediator's",
        ),
        (f"node lock m1 take --info '{lock_info(run_id='r-1')}'", "not a remediator run's"),
        (f"node lock m1 take --info '{lock_info(token='')}'", "token is not one"),
        (f"node lock m1 take --info '{lock_info(node='n9')}'", "node 'n9' is not an inventory"),
        (f"node lock m1 take --info '{lock_info(extra=1)}'", "exactly a lock's fields"),
        ("node lock m1 take --info '[]'", "--info is not a lock"),
        ("node lock m1 release --token 'x; id'", "is not a lock token"),
        ("node lock m1 break --expected-sha256 00", "is not a SHA-256"),
        ("node pid-alive 0", "is not a process id"),
        ("node pid-alive 42 --start-time nan", "not a process start time"),
    ],
)
def test_the_remediators_key_runs_only_what_the_remediator_sends(line: str, reason: str) -> None:
    with pytest.raises(Refused) as refused:
        check(f"mlx-medic {line}")
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("node facts m1", "'node facts' is not allowed for the serve key"),
        ("node service m1 stop --by 'remediator run 1' --reason x", "'node service' is not"),
        ("node lock m1 show", "'node lock' is not allowed for the serve key"),
        ("node probe m1 --timeout 10", "'node probe' is not allowed for the serve key"),
        ("node sweep m1", "needs --start-sweep"),
        ("node sweep m1 --orphans-only", "never sends --orphans-only"),
        ("node sweep m1 --start-sweep", "needs --grace"),
        (
            "node sweep m1 --start-sweep --grace 9",
            "not the model's policy.dead_launch_grace (0.25)",
        ),
        ("node sweep m1 --start-sweep --grace 0.25 --crashed-run x", "not a serve run id"),
        ("node sweep m2 --start-sweep --grace 0.25", "only on m2's other nodes"),  # n2: m2's head
        (
            f"node run m1 set {RUN} --lease 600 --holder 'serve pid 7 on n1'",
            "not the model's serve.lease (10)",
        ),
        (
            f"node run m1 set {RUN} --lease 10 --holder 'serve pid 7 on n2'",
            "is not the model's wrapper ('serve pid N on n1')",
        ),
        (f"node run m1 set {RUN}", "needs --lease; needs --holder"),
        ("node run m1 clear r-1", "'r-1' is not a serve run id"),
        ("node run m1 show", "never sends 'run show'"),
    ],
)
def test_the_serve_key_runs_only_what_the_wrapper_sends_to_its_peers(
    line: str, reason: str
) -> None:
    with pytest.raises(Refused) as refused:
        check(f"mlx-medic {line}", SERVE_ON_PEER)
    assert reason in str(refused.value)


def test_each_key_runs_its_own_helpers_and_never_the_forced_command_itself() -> None:
    assert helper_names("remediator") == [
        "backend",
        "clean",
        "drain",
        "facts",
        "lock",
        "orphans",
        "pid-alive",
        "probe",
        "reboot",
        "service",
        "session",
        "sweep",
    ]
    assert helper_names("serve") == ["clean", "pid-alive", "room", "run", "session", "sweep"]
    assert all("forced-command" not in helper_names(key) for key in KEYS)


def test_a_line_without_key_is_the_remediators_as_every_line_before_two_keys_was() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--inventory", str(CONFIG)]).key == "remediator"
    assert parser.parse_args(["--inventory", str(CONFIG), "--key", "serve"]).key == "serve"
    with pytest.raises(SystemExit):
        parser.parse_args(["--inventory", str(CONFIG), "--key", "root"])


def test_without_this_nodes_name_no_helper_runs() -> None:
    unknown = Allowed(INVENTORY, CONFIG, None, "which inventory node is this? pass --node NAME")
    with pytest.raises(Refused, match=r"this node.s name is unknown \(which inventory node"):
        validate("mlx-medic node facts m1 --json", unknown)
