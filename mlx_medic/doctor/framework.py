"""The doctor's checks: a registry, what each one found, and what they all may use.

A check verifies one assumption the project makes about a node (stated in `verifies`),
by running the product's own parser on this machine's output, so a pass means the
product reads this machine. It runs on the platforms it names and is `not-applicable`
elsewhere, saying why. A check whose assumption no verbatim capture from a real Mac
backs says so in `unverified`; the report lists those facts for an operator on a real
Mac to confirm.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from mlx_medic.doctor.commands import guarded
from mlx_medic.platform.commands import Runner, as_user, run_command

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model
    from mlx_medic.inventory.schema import Inventory, Node
    from mlx_medic.platform.listening import Probe

Status = Literal["passed", "failed", "not-applicable", "skipped"]
PASSED, FAILED, NOT_APPLICABLE, SKIPPED = get_args(Status)
PLATFORM_NAMES = {"darwin": "macOS", "linux": "Linux"}
BUG_FIX = "report this line in an issue: it is a bug in mlx-medic doctor"
NO_NODE = "no --inventory (and this node's name): nothing to compare with"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    fix: str = ""  # what to do, for a failure
    section: str = ""  # the node it is about, in a report of several ("" in one node's)


@dataclass(frozen=True)
class Outcome:
    """What a check found about one subject (a model, a user; "" when it has one)."""

    status: Status
    detail: str
    fix: str = ""
    subject: str = ""


def passed(detail: str, subject: str = "") -> Outcome:
    return Outcome(PASSED, detail, subject=subject)


def failed(detail: str, fix: str, subject: str = "") -> Outcome:
    return Outcome(FAILED, detail, fix, subject)


def not_applicable(detail: str, subject: str = "") -> Outcome:
    return Outcome(NOT_APPLICABLE, detail, subject=subject)


def skipped(detail: str, subject: str = "") -> Outcome:
    """Could not be checked as the doctor was run (another user, nothing running yet)."""
    return Outcome(SKIPPED, detail, subject=subject)


def platform_key(platform: str) -> str:
    return "linux" if platform.startswith("linux") else platform


def real_runner(user: str | None) -> Runner:
    return run_command if user is None else as_user(user)


def _process_iter() -> Callable[..., Iterable[Any]]:
    import psutil

    return psutil.process_iter


def _listening_probe() -> Callable[[], Probe]:
    from mlx_medic.platform.listening import listening_probe

    return listening_probe


def home_of(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


def current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


@dataclass
class DoctorContext:
    """This node as the checks see it; every seam a test replaces is a field."""

    platform: str  # sys.platform
    user: str  # who the doctor runs as
    inventory: Inventory | None = None
    inventory_path: Path | None = None
    node: Node | None = None  # this node, when there is an inventory
    run_as: Callable[[str | None], Runner] = real_runner  # None: as `user`
    process_iter: Callable[..., Iterable[Any]] = field(default_factory=lambda: _process_iter())
    listening: Callable[[], Probe] = field(default_factory=lambda: _listening_probe())
    home_of: Callable[[str], Path] = home_of
    is_dir: Callable[[Path], bool] = os.path.isdir
    proc_root: Path = Path("/proc")

    def __post_init__(self) -> None:
        self.platform = platform_key(self.platform)

    def runner(self, user: str | None = None) -> Runner:
        """Runs allow-listed commands only, as `user` (None or this user: as itself)."""
        return guarded(self.run_as(None if user == self.user else user))

    def models_here(self) -> list[Model]:
        """The models placed on this node (none without an inventory)."""
        if self.inventory is None or self.node is None:
            return []
        return self.inventory.models_on(self.node.name)

    @property
    def this_node(self) -> Node:
        """This node, for a check registered with `needs_node`."""
        if self.node is None:
            raise LookupError("this check needs --inventory and the node's name")
        return self.node

    def models_headed_here(self) -> list[Model]:
        return [m for m in self.models_here() if self.node and m.head == self.node.name]


CheckFunction = Callable[[DoctorContext], Iterable[Outcome]]


@dataclass(frozen=True)
class Check:
    name: str
    platforms: tuple[str, ...]  # platform_key values it runs on
    verifies: str  # the assumption, in one sentence
    run: CheckFunction
    unverified: str = ""  # what no capture from a real Mac backs yet ("" when all is)
    elsewhere: str = ""  # why it does not apply on the other platforms
    needs_node: bool = False  # compares with the inventory's entry for this node

    @property
    def unverified_on_hardware(self) -> bool:
        return bool(self.unverified)


CHECKS: dict[str, Check] = {}


def check(
    name: str,
    platforms: tuple[str, ...],
    verifies: str,
    *,
    unverified: str = "",
    elsewhere: str = "",
    needs_node: bool = False,
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check, in the order the report lists it. `needs_node`: it is skipped
    without an inventory (the function may rely on `context.node`)."""

    def register(run: CheckFunction) -> CheckFunction:
        if name in CHECKS:
            raise ValueError(f"two doctor checks are named {name!r}")
        CHECKS[name] = Check(name, platforms, verifies, run, unverified, elsewhere, needs_node)
        return run

    return register


def _results(check: Check, outcomes: Iterable[Outcome]) -> Iterator[CheckResult]:
    for outcome in outcomes:
        name = f"{check.name} {outcome.subject}" if outcome.subject else check.name
        yield CheckResult(name, outcome.status, outcome.detail, outcome.fix)


def run_check(check: Check, context: DoctorContext) -> list[CheckResult]:
    """One check's results; on another platform one `not-applicable` saying why. A check
    that crashes is a failure to report, not the end of the report."""
    if context.platform not in check.platforms:
        only = " and ".join(PLATFORM_NAMES.get(p, p) for p in check.platforms)
        why = check.elsewhere or f"{only} only"
        return list(_results(check, [not_applicable(why)]))
    if check.needs_node and (context.inventory is None or context.node is None):
        return list(_results(check, [skipped(NO_NODE)]))
    try:
        return list(_results(check, check.run(context)))
    except Exception as exc:  # a bug in a check; NotReadOnly among them
        crash = failed(
            f"the check itself failed: {type(exc).__name__}: {exc}",
            BUG_FIX,
        )
        return list(_results(check, [crash]))


def run_checks(context: DoctorContext, checks: Iterable[Check]) -> list[CheckResult]:
    return [result for c in checks for result in run_check(c, context)]
