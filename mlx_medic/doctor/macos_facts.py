"""What the project assumes macOS prints: `ps` states, `ibv_devinfo`, `ioclasscount`, the
service user's temp dir and the model's launchd job. Each is read with the product's own
parser (mlx_medic/platform/), so a pass means the exporter reads this Mac."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from mlx_medic.doctor.framework import (
    NOT_APPLICABLE,
    PASSED,
    DoctorContext,
    Outcome,
    Status,
    check,
    failed,
    not_applicable,
    passed,
    skipped,
)
from mlx_medic.platform.commands import CommandError, ParseError, output_of
from mlx_medic.platform.macos_launchd import parse_launchctl_print
from mlx_medic.platform.macos_rdma import (
    IBV_DEVINFO_ARGV,
    IOCLASSCOUNT_ALL_ARGV,
    IOCLASSCOUNT_ARGV,
    RDMA_OBJECT_CLASSES,
    parse_ibv_devinfo,
    parse_ioclasscount,
    rdma_object_counts,
    rdma_tool_output,
)
from mlx_medic.platform.proc_macos import PS_COMMAND, parse_ps_axo
from mlx_medic.platform.temp_dirs import (
    GETCONF_ARGV,
    GETCONF_TIMEOUT,
    parse_darwin_user_temp_dir,
)
from mlx_medic.service_manager import LAUNCHCTL

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model

T = TypeVar("T")
TIMEOUT = 10.0
PASTE = "paste this output into an issue: the product's parser does not read it"
ENABLE_RDMA = (
    "enable RDMA over Thunderbolt on this Mac (`rdma_ctl enable` in recoveryOS, then"
    " reboot; `rdma_ctl status` prints `enabled`), or take the jaccl backend off its models"
)
MACOS_ONLY_RDMA = "macOS only: Linux nodes have no Thunderbolt RDMA"


def state_counts(letters: list[str]) -> str:
    """`S 410, R 3, U 2`: how many processes are in each state, most first."""
    return ", ".join(f"{letter} {n}" for letter, n in Counter(letters).most_common())


@check(
    "ps-states",
    ("darwin",),
    "`/bin/ps -axo pid=,ppid=,stat=` prints a `pid ppid stat` row per process, each state"
    " one the exporter knows (`U`: uninterruptible, the seed's orphans)",
    unverified="no capture of `ps -axo pid=,ppid=,stat=` itself is on file: the state words"
    " come from `ps aux` and `ps -o stat` captures (tests/fixtures/macos/ps_*.txt), and"
    " I, T, Z and H were never seen in one",
    elsewhere="macOS only: on Linux the exporter reads states from /proc (proc-states)",
)
def ps_states(context: DoctorContext) -> Iterator[Outcome]:
    try:
        text = output_of(context.runner(), PS_COMMAND, TIMEOUT)
    except CommandError as exc:
        yield failed(str(exc), "the exporter reads every process's state with this command")
        return
    rows = parse_ps_axo(text)
    lines = [line for line in text.splitlines() if line.strip()]

    def read(line: str) -> bool:
        words = line.split()
        row = rows.get(int(words[0])) if words and words[0].isdigit() else None
        return row is not None and len(words) >= 3 and row.stat == words[2]

    unread = [line for line in lines if not read(line)]
    if not rows or unread:
        yield failed(
            f"{len(unread)} of {len(lines)} lines are not a `pid ppid stat` row with a state"
            f" the exporter knows, e.g. {unread[0].strip()[:80]!r}"
            if unread
            else "ps printed nothing",
            f"{PASTE} (mlx_medic/platform/proc_macos.py PS_STATE_LETTERS); the exporter"
            " leaves those processes out",
        )
        return
    letters = [row.stat[0] for row in rows.values()]
    yield passed(f"{len(rows)} processes, states {state_counts(letters)}")


def jaccl_models(context: DoctorContext) -> list[str]:
    return [m.name for m in context.models_here() if m.backends.jaccl is not None]


def jaccl_here(context: DoctorContext) -> str:
    jaccl = jaccl_models(context)
    return f"; JACCL models here: {', '.join(jaccl)}" if jaccl else "; no JACCL model here"


def needed_here(context: DoctorContext, what: str, fix: str, otherwise: Status) -> Outcome:
    """`what` is missing: a failure on a node with a JACCL model, else `otherwise`."""
    said = what + jaccl_here(context)
    return failed(said, fix) if jaccl_models(context) else Outcome(otherwise, said)


def rdma_reading(
    context: DoctorContext, argv: tuple[str, ...], parse: Callable[[str], T]
) -> T | Outcome:
    """The tool's output as the exporter parses it, or the outcome that ends the check:
    the tool fails or prints something else, or is not installed."""
    try:
        text = rdma_tool_output(context.runner(), argv, TIMEOUT)
        if text is not None:
            return parse(text)
    except (CommandError, ParseError) as exc:
        return failed(str(exc), PASTE)
    return needed_here(context, f"{argv[0]} is not installed", ENABLE_RDMA, NOT_APPLICABLE)


@check(
    "ibv-devinfo",
    ("darwin",),
    "`ibv_devinfo` prints `hca_id:`, `port:` and `state:` lines the exporter reads (JACCL"
    " needs every rdma_enX port PORT_ACTIVE)",
    elsewhere=MACOS_ONLY_RDMA,
)
def ibv_devinfo(context: DoctorContext) -> Iterator[Outcome]:
    ports = rdma_reading(context, IBV_DEVINFO_ARGV, parse_ibv_devinfo)
    if isinstance(ports, Outcome):
        yield ports
    elif not ports:
        off = "No IB devices found: RDMA over Thunderbolt is off"
        yield needed_here(context, off, ENABLE_RDMA, PASSED)
    else:
        states = ", ".join(f"{p.device} port {p.port} {p.state}" for p in ports)
        yield passed(states + jaccl_here(context))


@check(
    "ioclasscount",
    ("darwin",),
    "`ioclasscount AppleThunderboltRDMAProtectionDomain AppleThunderboltRDMAQueuePair`"
    " prints `Class = N` for both (the live RDMA objects that leaked ranks hold)",
    unverified="no capture of ioclasscount counting the RDMA classes is on file:"
    " tests/fixtures/macos/ioclasscount_rdma_reconstructed.txt is built from ioclasscount.c's"
    " format, and the class names come from a third-party runbook",
    elsewhere=MACOS_ONLY_RDMA,
)
def ioclasscount(context: DoctorContext) -> Iterator[Outcome]:
    counts = rdma_reading(context, IOCLASSCOUNT_ARGV, rdma_object_counts)
    if isinstance(counts, Outcome):
        yield counts
        return
    missing = [name for kind, name in RDMA_OBJECT_CLASSES.items() if kind not in counts]
    if not missing:
        found = ", ".join(f"{kind} {n}" for kind, n in counts.items())
        yield passed(found + jaccl_here(context))
        return
    fix = (
        f"{ENABLE_RDMA}. If RDMA is on, the class names the exporter counts are not this"
        " kernel's: paste this line into an issue"
    )
    what = f"no such class: {', '.join(missing)}; {rdma_classes(context)}"
    yield needed_here(context, what, fix, PASSED)


def rdma_classes(context: DoctorContext) -> str:
    """The kernel's classes with RDMA in their name, from ioclasscount's full list."""
    try:
        text = rdma_tool_output(context.runner(), IOCLASSCOUNT_ALL_ARGV, TIMEOUT)
        names = sorted(n for n in parse_ioclasscount(text or "") if "rdma" in n.lower())
    except (CommandError, ParseError) as exc:
        return f"the full class list could not be read ({exc})"
    return f"the kernel's RDMA classes: {', '.join(names) or 'none'}"


@check(
    "user-temp-dir",
    ("darwin", "linux"),
    "mlx.launch's mktemp files land in the service user's temp dir, where the exporter"
    " counts leftovers: macOS `getconf DARWIN_USER_TEMP_DIR` asked as that user prints one"
    " absolute path that exists; Linux /tmp",
)
def user_temp_dir(context: DoctorContext) -> Iterator[Outcome]:
    inventory = context.inventory
    if inventory is not None and inventory.launch_temp_dirs:
        dirs = ", ".join(map(str, inventory.launch_temp_dirs))
        yield not_applicable(f"the inventory's launch_temp_dirs name them: {dirs}")
        return
    if context.platform == "linux":
        where = "/tmp (mktemp's default for a user whose TMPDIR the exporter cannot know)"
        yield (
            passed(where)
            if context.is_dir(Path("/tmp"))
            else failed("/tmp is not a directory", "mlx.launch's mktemp needs /tmp")
        )
        return
    models = context.models_here()
    users = dict.fromkeys(m.service.user or context.user for m in models) or {context.user: None}
    for user in users:
        yield darwin_temp_dir(context, user)


def darwin_temp_dir(context: DoctorContext, user: str) -> Outcome:
    if user != context.user and context.user != "root":
        return skipped(
            f"getconf answers for the user who asks: run the doctor as root or as {user}",
            user,
        )
    try:
        text = output_of(context.runner(user), GETCONF_ARGV, GETCONF_TIMEOUT)
        path = parse_darwin_user_temp_dir(text)
    except (CommandError, ParseError) as exc:
        fix = f"the exporter leaves {user}'s mlx.launch leftovers uncounted until this works"
        return failed(str(exc), fix, user)
    if not context.is_dir(path):
        return failed(f"{path} is not a directory", f"log in once as {user}", user)
    return passed(str(path), user)


@check(
    "launchd-job",
    ("darwin",),
    "each launchd model headed here is loaded as system/LABEL (what `launchctl bootout` and"
    " `kickstart` name) from the inventory's plist, as service.user, running what `mlx-medic"
    " render launchd` writes",
    elsewhere="macOS only: the product reads nothing from systemctl or supervisorctl",
)
def launchd_job(context: DoctorContext) -> Iterator[Outcome]:
    models = [m for m in context.models_headed_here() if m.service.manager == "launchd"]
    if not models:
        yield not_applicable("no launchd model has its head here")
    for model in models:
        yield launchd_model(context, model)


def launchd_model(context: DoctorContext, model: Model) -> Outcome:
    from mlx_medic.render import services
    from mlx_medic.render.files import RenderError

    service = model.service
    target = f"system/{service.label}"
    plist = str(service.plist_path)
    load = f"sudo launchctl bootstrap system {plist}"
    try:
        result = context.runner()((LAUNCHCTL, "print", target), TIMEOUT)
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip().splitlines()
            why = f": {said[0][:200]}" if said else ""
            return failed(
                f"{target} is not loaded (launchctl print exited {result.returncode}{why})",
                f"load it: {load} (`mlx-medic node service {model.name} status` says whether"
                " a run stopped it)",
                model.name,
            )
        job = parse_launchctl_print(result.stdout, target)
    except (CommandError, ParseError) as exc:
        return failed(str(exc), PASTE, model.name)
    problems = []
    if job.path != plist:
        problems.append(f"loaded from {job.path}, the inventory's plist is {plist}")
    if service.user is not None and job.username != service.user:
        problems.append(f"runs as {job.username or 'root'}, service.user is {service.user}")
    if service.kind == "wrapper" and context.inventory is not None:
        try:
            expected = services.serve_argv(context.inventory, model)
        except RenderError as exc:
            problems.append(str(exc))
        else:
            if list(job.arguments) != expected:
                problems.append(
                    f"runs `{' '.join(job.arguments)}`, render writes `{' '.join(expected)}`"
                )
    state = f"state = {job.state}" + (f", pid {job.fields['pid']}" if "pid" in job.fields else "")
    if problems:
        fix = f"install `mlx-medic render launchd`'s plist as {plist}, then bootout and {load}"
        return failed(f"{target}: {'; '.join(problems)} ({state})", fix, model.name)
    return passed(f"{target} from {plist} ({state})", model.name)
