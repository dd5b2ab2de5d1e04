"""What each key in a node's `authorized_keys` may run: one table, the forced command's
only source (`mlx-medic node forced-command --key KEY`).

Two keys log in to a node as its login user, and each may send exactly what its own
user's code sends, nothing more:
- `remediator` (`ssh.identity_file`): the remediator's engine, its playbook steps, the
  model lock and the health probe of a model on its head (`probe`); and `mlx-medic
  doctor --config.file` on the remediator's host, which sends the read-only form of each
  (the dry runs of the sweep and the clean, `backend MODEL show`).
- `serve` (`models.<name>.serve.identity_file`): the serve wrapper on a model's head,
  to the model's other nodes: the start sweep, the run's record and lease, the teardown,
  and `pid-alive` for a lock holder on a peer (its own head it reaches without SSH).
Both send `session` first (the SSH transport's one login per node), and every request in
it is checked against the same key's grants, as a login of its own would be.

A Grant is one command line shape: the helper, its action, its positional values and
options, each value checked against the inventory (a run id's shape, the
model's own lease and grace, who stops a service). A request must match one grant of
its key exactly: every required option, no option the grant does not name. The tail
every caller adds (`--inventory`, `--state-dir`, `--node`, `--json`, `--time-limit`) and MODEL (an
inventory model placed on this node) are checked by the forced command for every grant.
tests/node/test_key_table.py drives the engine, the model lock, the remote probe and the
serve wrapper with recording transports: everything they send passes, and every grant
(and every optional option) is sent by one of them, so no grant is dead.

    python -m mlx_medic.node.key_table   # the table, as docs/security.md shows it

One module at about 390 lines: the table is the forced command's only source, so every
grant and every value check stays in one place to read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model
    from mlx_medic.inventory.schema import Inventory

KeyName = Literal["remediator", "serve"]
KEYS: tuple[KeyName, ...] = ("remediator", "serve")
MAX_PROBE_TIMEOUT = 600.0
MAX_TEXT = 500  # a --reason is a record for people, never a payload


class Refused(ValueError):
    """The requested command is not one this key may run; the message says why."""


@dataclass(frozen=True)
class Request:
    """What a value is checked against: the inventory, this node, the model named."""

    inventory: Inventory
    this_node: str
    model: Model | None = None


@dataclass(frozen=True)
class Value:
    """A value in a grant: its name in the table and its check (raises Refused)."""

    name: str
    check: Callable[[Any, Request], None] = field(repr=False, compare=False)


def _pattern(name: str, regex: str, what: str) -> Value:
    compiled = re.compile(regex)

    def check(value: Any, _request: Request) -> None:
        if not compiled.fullmatch(str(value)):
            raise Refused(f"{value!r} is not {what}")

    return Value(name, check)


def _literal(word: str) -> Value:
    def check(value: Any, _request: Request) -> None:
        if value != word:
            raise Refused(f"{value!r} is not {word!r}")

    return Value(word, check)


def _text(value: Any, _request: Request) -> None:
    """Free text for a record (a JACCL log line, as the remediator cuts it): one line."""
    text = str(value)
    if len(text) > MAX_TEXT or any(c in text for c in "\n\r\0"):
        raise Refused(f"a record's text must be one line of at most {MAX_TEXT} characters")


def _pid(value: Any, _request: Request) -> None:
    if not isinstance(value, int) or value <= 0:
        raise Refused(f"{value!r} is not a pid")


def _start_time(value: Any, _request: Request) -> None:
    if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
        raise Refused(f"{value!r} is not a process start time")


def _model(request: Request) -> Model:
    assert request.model is not None  # every grant with a model-bound value takes MODEL
    return request.model


def _same_seconds(name: str, expected: Callable[[Model], float], source: str) -> Value:
    """The model's own setting, as its sender formats it (`f"{seconds:g}"`)."""

    def check(value: Any, request: Request) -> None:
        wanted = float(f"{expected(_model(request)):g}")
        if not isinstance(value, float) or value != wanted:
            raise Refused(f"{value!r} is not {source} ({wanted:g})")

    return Value(name, check)


def _serve_holder(value: Any, request: Request) -> None:
    head = _model(request).head
    if not re.fullmatch(rf"serve pid [1-9][0-9]{{0,9}} on {re.escape(head)}", str(value)):
        raise Refused(f"{value!r} is not the model's wrapper ('serve pid N on {head}')")


def _remediator_lock(value: Any, request: Request) -> None:
    """A lock the remediator writes: its engine's holder and run id, its own node or none."""
    from mlx_medic.state.model_lock_file import LockInfo

    try:
        info = LockInfo.parse(str(value))
        keys = set(json.loads(str(value)))
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"--info is not a lock ({exc})") from None
    if keys != set(LockInfo.__dataclass_fields__):
        raise Refused("--info must carry exactly a lock's fields")
    if info.holder not in ("remediator", "manual"):
        raise Refused(f"holder {info.holder!r} is not the remediator's (remediator, manual)")
    if not re.fullmatch(r"[1-9][0-9]{0,17}", info.run_id):
        raise Refused(f"run id {info.run_id!r} is not a remediator run's")
    if not re.fullmatch(r"[0-9a-f]{16}", info.token):
        raise Refused("the lock's token is not one the remediator makes")
    nodes = {node.name for node in request.inventory.nodes}
    if info.node is not None and info.node not in nodes:
        raise Refused(f"the lock's node {info.node!r} is not an inventory node")


def _probe_timeout(value: Any, _request: Request) -> None:
    try:
        seconds = float(value)
    except ValueError:
        raise Refused(f"--timeout {value!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_PROBE_TIMEOUT):
        raise Refused(f"--timeout {value!r} is not between 0 and {MAX_PROBE_TIMEOUT:g} seconds")


# --- the values --------------------------------------------------------------------------
BY_RUN = _pattern(  # a record from before runs named their replica: without it
    "'remediator run N (pid P on HOST)'",
    r"remediator run [1-9][0-9]{0,17}"
    r"( \(pid [1-9][0-9]{0,9} on [A-Za-z0-9][A-Za-z0-9._-]{0,252}\))?",
    "a remediator run ('remediator run N (pid P on HOST)')",
)
REASON = Value("REASON", _text)
LOCK = Value("LOCK_JSON", _remediator_lock)
TOKEN = _pattern("TOKEN", r"[0-9a-f]{16}", "a lock token")
SHA256 = _pattern("SHA256", r"[0-9a-f]{64}", "a SHA-256 in hex")
PID = Value("PID", _pid)
START_TIME = Value("START_TIME", _start_time)
RUN_ID = _pattern("RUN_ID", r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}", "a serve run id")
GRACE = _same_seconds(
    "GRACE",
    lambda m: min(m.policy.dead_launch_grace, m.policy.kill_grace),
    "the model's policy.dead_launch_grace",
)
LEASE = _same_seconds("LEASE", lambda m: m.serve.lease, "the model's serve.lease")
HOLDER = Value("'serve pid N on HEAD'", _serve_holder)
SECONDS = Value("SECONDS", _probe_timeout)
MODELS = _pattern(
    "M,M",
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}(,[A-Za-z0-9][A-Za-z0-9._-]{0,63})*",
    "model names, comma-separated",
)

Options = Mapping[str, Value | None]  # --option -> its value (None: a bare flag)


@dataclass(frozen=True)
class Grant:
    """One command line shape a key may send."""

    helper: str  # a node helper
    action: str | None = None  # the helper's subcommand (`service MODEL stop`)
    args: Mapping[str, Value] = field(default_factory=dict)  # positional dest -> value
    options: Options = field(default_factory=dict)  # required
    optional: Options = field(default_factory=dict)
    model: bool = True  # takes MODEL, an inventory model placed on this node
    peer: bool = False  # only on a node of MODEL other than its head
    sent_by: str = ""  # who sends it (for the table and docs/security.md)

    def shape(self) -> str:
        """The command line as the table shows it, e.g. `run MODEL set RUN_ID --lease LEASE`."""
        words = [self.helper] + (["MODEL"] if self.model else [])
        words += [self.action] if self.action else []
        words += [value.name for value in self.args.values()]
        for option, value in self.options.items():
            words += [option] + ([value.name] if value else [])
        for option, value in self.optional.items():
            words.append(f"[{option}{' ' + value.name if value else ''}]")
        return " ".join(words)

    def mismatch(
        self, given: Mapping[str, Any], positional: Mapping[str, Any], request: Request
    ) -> str | None:
        """Why this request is not this grant's shape, or None when it is."""
        missing = [option for option in self.options if option not in given]
        extra = [option for option in given if option not in {**self.options, **self.optional}]
        if missing or extra:
            return "; ".join(
                [
                    *(f"needs {o}" for o in missing),
                    *(f"the key never sends {o} here" for o in extra),
                ]
            )
        if self.model and positional.get("model") is None:
            return "needs MODEL"
        model = request.model
        if self.peer and model is not None and model.head == request.this_node:
            return (
                f"only on {model.name}'s other nodes (its wrapper reaches {model.head},"
                " its head, without SSH)"
            )
        try:
            for dest, value in self.args.items():
                value.check(positional.get(dest), request)
            for option, check in {**self.options, **self.optional}.items():
                if check is not None and option in given:
                    check.check(given[option], request)
        except Refused as exc:
            return str(exc)
        return None


REMEDIATOR_RUN = "the remediator's run"
SESSION = Grant(
    "session",
    model=False,
    sent_by="the SSH transport: one login per node for this key's helpers, each request"
    " checked against this table as its own login would be",
)
DOCTOR = "`mlx-medic doctor --config.file`, read-only"
LOCK_USER = "the model lock (the remediator's)"
TABLE: dict[KeyName, tuple[Grant, ...]] = {
    "remediator": (
        SESSION,
        Grant("facts", sent_by=f"{REMEDIATOR_RUN}: preflight, verify, escalation"),
        Grant(
            "orphans",
            sent_by=f"{REMEDIATOR_RUN}: sweep-orphans' re-check and its confirm-clean checks",
        ),
        Grant("sweep", sent_by=f"{REMEDIATOR_RUN}: recover's and finish-stop's sweep"),
        Grant(
            "sweep", options={"--orphans-only": None}, sent_by=f"{REMEDIATOR_RUN}: sweep-orphans"
        ),
        Grant("sweep", options={"--dry-run": None}, sent_by=f"{DOCTOR}: the sweep"),
        Grant(
            "sweep",
            options={"--orphans-only": None, "--dry-run": None},
            sent_by=f"{DOCTOR}: sweep-orphans",
        ),
        Grant("clean", sent_by=f"{REMEDIATOR_RUN}: clean-tmp"),
        Grant("clean", options={"--dry-run": None}, sent_by=f"{DOCTOR}: clean-tmp"),
        Grant(
            "service",
            "stop",
            options={"--by": BY_RUN, "--reason": REASON},
            sent_by=f"{REMEDIATOR_RUN}: stop-service",
        ),
        Grant("service", "start", sent_by=f"{REMEDIATOR_RUN}: start-service"),
        Grant("service", "restart", sent_by=f"{REMEDIATOR_RUN}: restart-service after pin-ring"),
        Grant("service", "status", sent_by=f"{REMEDIATOR_RUN}: finish-stop's re-check"),
        Grant(
            "backend",
            "set",
            args={"choice": _literal("ring")},
            options={"--by": BY_RUN, "--reason": REASON},
            sent_by=f"{REMEDIATOR_RUN}: pin-ring",
        ),
        Grant("backend", "show", sent_by=f"{DOCTOR}: pin-ring's helper"),
        Grant("lock", "take", options={"--info": LOCK}, sent_by=LOCK_USER),
        Grant("lock", "show", sent_by=f"{LOCK_USER}: a crashed run's lock at start-up"),
        Grant(
            "lock",
            "replace",
            options={"--expected-token": TOKEN, "--info": LOCK},
            sent_by=f"{LOCK_USER}: its renewal",
        ),
        Grant("lock", "release", options={"--token": TOKEN}, sent_by=LOCK_USER),
        Grant(
            "lock",
            "break",
            options={"--expected-sha256": SHA256},
            sent_by=f"{LOCK_USER}: a stale lock",
        ),
        Grant(
            "pid-alive",
            model=False,
            args={"pid": PID},
            optional={"--start-time": START_TIME},
            sent_by=f"{LOCK_USER}: is a holder alive on its node",
        ),
        Grant(
            "drain",
            "set",
            model=False,
            options={"--by": REASON},
            optional={"--models": MODELS},
            sent_by="`mlx-medic drain NODE`: the record on the node",
        ),
        Grant(
            "drain",
            "clear",
            model=False,
            sent_by="`mlx-medic undrain NODE`: the record on the node",
        ),
        Grant(
            "reboot",
            model=False,
            sent_by=f"{REMEDIATOR_RUN}: reboot-node (the helper refuses unless reboot.allowed)",
        ),
        Grant(
            "probe",
            options={"--timeout": SECONDS},
            sent_by="the remediator's health probe of a model on its head (its loopback)",
        ),
    ),
    "serve": (
        SESSION,
        Grant(
            "sweep",
            options={"--start-sweep": None, "--grace": GRACE},
            optional={"--crashed-run": RUN_ID},
            peer=True,
            sent_by="the wrapper's start sweep (after a crash: its own run's)",
        ),
        Grant(
            "sweep",
            options={"--run": RUN_ID},
            optional={"--grace": GRACE},
            peer=True,
            sent_by="the wrapper's teardown of its run",
        ),
        Grant("clean", peer=True, sent_by="the wrapper's clean before a start"),
        Grant(
            "room",
            optional={"--sha256": None},
            peer=True,
            sent_by="the wrapper's memory and disk check before a start (and after a preseed)",
        ),
        Grant(
            "run",
            "set",
            args={"run_id": RUN_ID},
            options={"--lease": LEASE, "--holder": HOLDER},
            peer=True,
            sent_by="the wrapper records its run and lease",
        ),
        Grant(
            "run",
            "renew",
            args={"run_id": RUN_ID},
            options={"--lease": LEASE, "--holder": HOLDER},
            peer=True,
            sent_by="the wrapper's lease renewal",
        ),
        Grant(
            "run",
            "clear",
            args={"run_id": RUN_ID},
            peer=True,
            sent_by="the wrapper's teardown ends its lease",
        ),
        Grant(
            "pid-alive",
            model=False,
            args={"pid": PID},
            optional={"--start-time": START_TIME},
            sent_by="the wrapper's model lock: is a holder on a peer alive",
        ),
    ),
}


def grants(key: KeyName) -> tuple[Grant, ...]:
    return TABLE[key]


def helpers_of(key: KeyName) -> list[str]:
    """The helpers a key may run at all."""
    return sorted({grant.helper for grant in TABLE[key]})


def match(
    key: KeyName,
    helper: str,
    action: str | None,
    given: Mapping[str, Any],
    positional: Mapping[str, Any],
    request: Request,
) -> Grant:
    """The grant of `key` this request is, or Refused naming the shapes it may send."""
    command = " ".join(word for word in (helper, action) if word)
    candidates = [g for g in TABLE[key] if g.helper == helper and g.action == action]
    if not candidates:
        sends = sorted({" ".join(w for w in (g.helper, g.action) if w) for g in TABLE[key]})
        raise Refused(f"the {key} key never sends {command!r} (it sends: {', '.join(sends)})")
    problems = []
    for grant in candidates:
        why = grant.mismatch(given, positional, request)
        if why is None:
            return grant
        problems.append(f"`{grant.shape()}`: {why}")
    raise Refused(f"not what the {key} key sends: " + "; ".join(problems))


def table_text() -> str:
    """The table as markdown: per key, each shape and who sends it."""
    lines = []
    for key in KEYS:
        lines += [f"### `--key {key}`", "", "| command | sent by |", "|---|---|"]
        lines += [f"| `mlx-medic node {g.shape()}` | {g.sent_by} |" for g in TABLE[key]]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _main() -> None:
    print(table_text(), end="")


if __name__ == "__main__":
    _main()
